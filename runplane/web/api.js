// The one way the page reaches the server: the public HTTP API, with the token the user gave.

const KEY = "runplane.token";

export class ApiError extends Error {
  constructor(status, code, text, retryAfter = null) {
    super(text);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter; // milliseconds the server asked to wait, or null
  }
}

// A Retry-After header (seconds, or an HTTP date) in milliseconds, or null.
export function retryAfterMs(header, now = Date.now()) {
  if (!header) return null;
  const trimmed = header.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const at = Date.parse(trimmed);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

// A call with the tab's token; or with ``bearer``, a token the tab does not hold (yet), whose
// refusal signs nobody out.
export async function api(method, path, { query, body, bearer } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Authorization: `Bearer ${bearer ?? (token.get() || "")}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch {
    throw new ApiError(0, "unreachable", "The API cannot be reached.");
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data && data.error ? data.error : { code: "http_error", message: `HTTP ${response.status}` };
    const failure = new ApiError(response.status, error.code, error.message, retryAfterMs(response.headers.get("Retry-After")));
    if (response.status === 401 && bearer === undefined) window.dispatchEvent(new CustomEvent("runplane:unauthorized", { detail: failure }));
    throw failure;
  }
  return data;
}

export const get = (path, query) => api("GET", path, { query });
export const post = (path, body) => api("POST", path, { body: body ?? {} });
