"""Envelope encryption shared by every stack's secret keys: a value is encrypted with AES-256-GCM
under a fresh data key, bound to its context (scope and name) as associated data; the data key
is wrapped by the stack's key (KMS, Key Vault, a key file), which is the part each stack differs in.
``cryptography`` comes with the stack's extras, not with the client: it is imported where it is used."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping

from runplane.domain.secrets import Sealed, SecretUnavailable, associated_data

DATA_KEY_BYTES = 32
NONCE_BYTES = 12


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SecretUnavailable(f"the stored {what} is not base64") from None


def new_data_key() -> bytes:
    return os.urandom(DATA_KEY_BYTES)


def seal_with(data_key: bytes, wrapped_key: bytes, key_id: str, value: bytes, context: Mapping[str, str]) -> Sealed:
    """``value`` encrypted under ``data_key`` (which ``key_id`` wrapped as ``wrapped_key``)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # the server's extras only, not the client's

    nonce = os.urandom(NONCE_BYTES)
    ciphertext = AESGCM(data_key).encrypt(nonce, value, associated_data(dict(context)))
    return Sealed(key_id=key_id, wrapped_key=b64(wrapped_key), nonce=b64(nonce), ciphertext=b64(ciphertext))


def open_with(data_key: bytes, sealed: Sealed, context: Mapping[str, str]) -> bytes:
    """The value of ``sealed``, whose data key is ``data_key``. Raises SecretUnavailable when it
    was not sealed for ``context`` or was altered."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if len(data_key) != DATA_KEY_BYTES:
        raise SecretUnavailable("the data key does not open this value")
    try:
        return AESGCM(data_key).decrypt(
            unb64(sealed.nonce, "nonce"), unb64(sealed.ciphertext, "ciphertext"), associated_data(dict(context))
        )
    except InvalidTag:
        raise SecretUnavailable("the value was not sealed for this secret, or was altered") from None
