// The one way the page reaches the server: the public HTTP API, with the token the user gave.

const KEY = "runplane.token";

export class ApiError extends Error {
  constructor(status, code, text) {
    super(text);
    this.status = status;
    this.code = code;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export async function api(method, path, { query, body } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Authorization: `Bearer ${token.get() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data && data.error ? data.error : { code: "http_error", message: `HTTP ${response.status}` };
    const failure = new ApiError(response.status, error.code, error.message);
    if (response.status === 401) window.dispatchEvent(new CustomEvent("runplane:unauthorized", { detail: failure }));
    throw failure;
  }
  return data;
}

export const get = (path, query) => api("GET", path, { query });
export const post = (path, body) => api("POST", path, { body: body ?? {} });
