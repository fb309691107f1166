"""Signed artifacts: Ed25519 signatures over cache entries and module records, checked against
the keys a deployment trusts before any native code they describe is loaded.

What is signed is a record's whole content: an entry record holds the kernel's metadata and
every artifact's sha256 and size, its key, arch, compiler and options; a module record its
fields and which entry each kernel is. The message is the msgpack encoding of that content
(its fields sorted by name, each as the record stores it) with the record's kind and the
artifact format version, minus what may change without changing what runs: build times (zeroed by `qdc pack`), and the
module record's copy of each kernel's parameters (taken from the signed entries). So a
signature survives `qdc pack` and `qdc merge` but no change to any code or metadata, and an
artifact swapped under a record fails its sha256 check.

Where signatures live:
    entries/<kk>/<key>/signature-<fingerprint>   one file per signing key, beside meta.msgpack
    modules/<arch>/<module>.msgpack              the record's "signed" list (replaced with it)
                                                 and its "attested" statements (below)
An entry is immutable (on a remote store, create-if-absent), so signatures are files of their
own: a CI run can sign an entry another run wrote, and a second key can sign it too (key
rotation). A signature is {"public_key": 32 bytes, "name": the key's name, "signature": 64
bytes}; keys are named by fingerprint, the first 128 bits of sha256 of the public key.

One signature check per kernel would make loading a module of many kernels noticeably slower
(an Ed25519 verification costs about as much as loading a small library), so a signing build
also puts into each module record a statement, signed, of the digest (sha256 of the signed
message) of every entry it names: `load` checks the module record and the statements (one per
shard that built the module), and then each entry by its digest alone; an entry no trusted
statement covers is checked by its own signature. Statements are kept where they still cover
an entry, so `qdc merge` keeps each shard's.

Key files (`qdc keygen KEYFILE`): KEYFILE is the private key (PKCS#8 PEM, mode 0600); KEYFILE.pub
one line `qdc-ed25519 <base64 public key> <name>`. Trusted keys are such lines (files of them or
their text); a line `@revoked <key line or fingerprint>` revokes a key: what it signed is refused.

The cryptography package (extra `sign`) is imported only when keys are used, so a deployment
that configures none needs nothing beyond the runtime's own dependencies.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re

import msgpack

from .contract import artifact as A

TRUSTED_KEYS_VARIABLE = "QDC_TRUSTED_KEYS"
REVOKED_KEYS_VARIABLE = "QDC_REVOKED_KEYS"
SIGNING_KEY_VARIABLE = "QDC_SIGNING_KEY"
EXTRA_HINT = ("signed artifacts need the cryptography package: pip install 'qdc[sign]' (a runtime-only "
              "deployment: pip install 'qdc-runtime[sign]')")

KEY_PREFIX = "qdc-ed25519"
REVOKED_MARK = "@revoked"
SIGNATURE_RECORD = "signature"
ATTESTATION = "entry-digests"  # what a statement in a module record's "attested" list signs
SIGNATURE_PREFIX = "signature-"
SIGNATURE_FILE_RE = re.compile(r"^signature-[0-9a-f]{32}$")
MAX_SIGNATURE_BYTES = 4096   # a signature file is ~150 bytes: anything larger is not read
MAX_SIGNATURES = 16          # signature files read per entry (keys in rotation, not a flood)
# Not signed: build times (zeroed by `qdc pack`), a module record's copy of its entries'
# parameters (merged from shards' records) and the signatures themselves.
UNSIGNED_FIELDS = frozenset(("created", "built", "signatures", "signed", "attested"))
_DOMAIN = b"qdc signed record v1\n"
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{32}$")


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ImportError(EXTRA_HINT) from None
    return ed25519


def available() -> bool:
    """Whether the cryptography package is installed (signatures can be made and checked)."""
    try:
        _ed25519()
        return True
    except ImportError:
        return False


def fingerprint(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:32]


def signature_file(fp: str) -> str:
    return f"{SIGNATURE_PREFIX}{fp}"


# ---- keys ------------------------------------------------------------------------------------

class PublicKey:
    """An Ed25519 public key and its name (free text: what `qdc inspect` shows beside the fingerprint)."""

    def __init__(self, raw: bytes, name: str = ""):
        if not isinstance(raw, bytes) or len(raw) != 32:
            raise ValueError("an Ed25519 public key is 32 bytes")
        self.raw, self.name = raw, " ".join(str(name).replace(",", " ").split())  # commas separate keys
        self.fingerprint = fingerprint(raw)
        self._key = None

    def text(self) -> str:
        return f"{KEY_PREFIX} {base64.b64encode(self.raw).decode()} {self.name}".rstrip()

    def describe(self) -> str:
        return f"'{self.name}' ({self.fingerprint})" if self.name else self.fingerprint

    def verifies(self, signature: bytes, message: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        try:
            if self._key is None:
                self._key = _ed25519().Ed25519PublicKey.from_public_bytes(self.raw)
            self._key.verify(signature, message)
            return True
        except (InvalidSignature, ValueError):  # ValueError: 32 bytes that are no Ed25519 point
            return False


class SigningKey:
    """A private Ed25519 key: what `qdc build --sign` signs with."""

    def __init__(self, private, name: str = ""):
        self._private = private
        from cryptography.hazmat.primitives import serialization as S
        raw = private.public_key().public_bytes(S.Encoding.Raw, S.PublicFormat.Raw)
        self.public = PublicKey(raw, name)

    @classmethod
    def generate(cls, name: str = "") -> "SigningKey":
        return cls(_ed25519().Ed25519PrivateKey.generate(), name)

    @classmethod
    def load(cls, spec) -> "SigningKey":
        """From a key file written by `qdc keygen` (named after its .pub's name), or its PEM text."""
        text, name = str(os.fspath(spec)), ""
        if "-----BEGIN" not in text:
            try:
                with open(text, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise ValueError(f"signing key '{text}': cannot read it ({e.strerror or e})") from None
            name = _pub_name(text)
            where = f"signing key '{text}'"
        else:
            data, where = text.encode(), "signing key text"
        ed25519 = _ed25519()
        from cryptography.hazmat.primitives import serialization as S
        try:
            private = S.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: not an unencrypted Ed25519 private key as `qdc keygen` writes ({e})") \
                from None
        if not isinstance(private, ed25519.Ed25519PrivateKey):
            raise ValueError(f"{where}: not an Ed25519 private key")
        return cls(private, name)

    def private_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization as S
        return self._private.private_bytes(S.Encoding.PEM, S.PrivateFormat.PKCS8, S.NoEncryption())

    def sign(self, kind: str, body: dict) -> dict:
        """The signature of record `body` of `kind` (a dict as stored in a signature file)."""
        return {"public_key": self.public.raw, "name": self.public.name,
                "signature": self._private.sign(signed_message(kind, body))}


def _pub_name(private_path: str) -> str:
    try:
        with open(private_path + ".pub", encoding="utf-8") as f:
            keys = parse_keys(f.read(), private_path + ".pub")
    except (OSError, ValueError):
        keys = []
    return keys[0][1].name if keys and isinstance(keys[0][1], PublicKey) else os.path.basename(private_path)


def keygen(path: str, name: str | None = None) -> SigningKey:
    """Write a new key pair: `path` (the private key, mode 0600, never overwritten) and `path`.pub."""
    path = os.fspath(path)
    key = SigningKey.generate(name if name is not None else os.path.basename(path))
    for p in (path, path + ".pub"):
        if os.path.lexists(p):
            raise FileExistsError(f"'{p}' exists: qdc keygen never overwrites a key (remove it, or choose "
                                  f"another name)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, key.private_pem())
    finally:
        os.close(fd)
    with open(path + ".pub", "w", encoding="utf-8") as f:
        f.write(key.public.text() + "\n")
    return key


def parse_keys(text: str, source: str) -> list[tuple[bool, "PublicKey | str"]]:
    """The keys of a trusted-keys text, one per line or separated by commas: (revoked, PublicKey),
    or (True, fingerprint) for a key revoked by fingerprint. Blank lines and `#` comments are skipped."""
    out = []
    lines = [(number, part.strip()) for number, line in enumerate(str(text).splitlines(), 1)
             for part in ([line] if line.strip().startswith("#") else line.split(","))]
    for number, line in lines:
        if not line or line.startswith("#"):
            continue
        revoked = line.startswith(REVOKED_MARK)
        words = line[len(REVOKED_MARK):].split() if revoked else line.split()
        where = f"{source}:{number}" if source else f"key '{line}'"
        if revoked and len(words) == 1 and _FINGERPRINT_RE.match(words[0].lower()):
            out.append((True, words[0].lower()))
            continue
        if len(words) < 2 or words[0] != KEY_PREFIX:
            raise ValueError(f"{where}: not a qdc public key (expected `{KEY_PREFIX} <base64> [name]` as "
                             f"`qdc keygen` writes to KEYFILE.pub, or `{REVOKED_MARK}` and a key or fingerprint)")
        try:
            raw = base64.b64decode(words[1], validate=True)
            out.append((revoked, PublicKey(raw, " ".join(words[2:]))))
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}: the key is not 32 bytes of base64") from None
    return out


def _items(value) -> list:
    """A trusted/revoked keys setting as a list of key files, keys' lines and fingerprints: a string
    is split at commas and newlines (a key's name has neither)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, os.PathLike)):
        value = [value]
    out = []
    for item in value:
        if isinstance(item, PublicKey):
            out.append(item)
            continue
        if isinstance(item, bytes):  # a key file's content, as read in binary
            item = item.decode("utf-8", "replace")
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"a trusted key is a key file path or a key's text, not {type(item).__name__}")
        out += [part.strip() for part in re.split(r"[,\n]", os.fspath(item))
                if part.strip() and not part.strip().startswith("#")]
    return out


def _read_item(item) -> list:
    if isinstance(item, PublicKey):
        return [(False, item)]
    if KEY_PREFIX in item or item.startswith(REVOKED_MARK):
        return parse_keys(item, "")
    try:
        with open(os.path.expanduser(item), encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"trusted key '{item}': neither a readable key file ({e.strerror or e}) nor a key's "
                         f"text (`{KEY_PREFIX} ...`)") from None
    if "PRIVATE KEY" in text:
        raise ValueError(f"trusted key '{item}' is a private key: trust its public half, '{item}.pub'")
    return parse_keys(text, item)


# ---- trust -------------------------------------------------------------------------------------

class Trust:
    """The keys a deployment trusts and those it revokes. A record is accepted when one of its
    signatures is by a trusted key that is not revoked and matches its content (so a key can
    be rotated: entries signed by either of two trusted keys load)."""

    def __init__(self, trusted: list, revoked: set):
        self.revoked = set(revoked)
        self.trusted = {k.fingerprint: k for k in trusted if k.fingerprint not in self.revoked}
        _ed25519()  # keys are configured: say now, not at the first entry, what to install

    def describe(self) -> str:
        return ", ".join(k.describe() for k in self.trusted.values()) or "none (every trusted key is revoked)"

    def refusal(self, kind: str, body: dict, signatures: list) -> str | None:
        """None if `signatures` (parsed ones, and problem strings for unreadable files) hold a
        trusted signature of `body`; else why the record is refused."""
        message = signed_message(kind, body)
        altered, revoked, unknown = [], [], []
        for sig in signatures:
            if isinstance(sig, str):
                unknown.append(sig)
                continue
            trusted = self.trusted.get(fingerprint(sig["public_key"]))
            if trusted is not None:
                if trusted.verifies(sig["signature"], message):
                    return None
                altered.append(trusted.describe())
                continue
            key = PublicKey(sig["public_key"], sig["name"])
            if key.fingerprint in self.revoked:
                revoked.append(key.describe())
            else:
                unknown.append(f"signed by an unknown key {key.describe()}")
        if altered:
            return (f"content altered after signing: the signature by {altered[0]} does not match it (the record or "
                    f"an artifact's hash was changed)")
        if revoked:
            return f"signed by a revoked key {revoked[0]}"
        if unknown:
            return f"{unknown[0]}, not by a trusted key (trusted: {self.describe()})"
        return (f"unsigned, and only what a trusted key signed is loaded (trusted: {self.describe()}); sign builds "
                f"with `qdc build --sign KEYFILE`")

    def attested(self, module_record: dict) -> dict:
        """Entry key -> digest, of the statements of `module_record` that a trusted key signed."""
        out = {}
        statements = module_record.get("attested", [])
        for st in statements[:MAX_SIGNATURES] if isinstance(statements, list) else ():
            if not (isinstance(st, dict) and isinstance(st.get("digests"), dict) and _is_signature(st.get("signature"))):
                continue
            sig = st["signature"]
            trusted = self.trusted.get(fingerprint(sig["public_key"]))
            if trusted is not None and trusted.verifies(sig["signature"], _attestation_message(module_record, st)):
                out.update(st["digests"])
        return out

    def signature_files(self) -> list[str]:
        """The names of the signature files that can hold a trusted signature."""
        return [signature_file(fp) for fp in self.trusted]

    def with_key(self, key: PublicKey) -> "Trust":
        return Trust([*self.trusted.values(), key], self.revoked)


def trust_from(trusted_keys=None, revoked_keys=None) -> Trust | None:
    """The Trust of a `trusted_keys` setting (else $QDC_TRUSTED_KEYS) and `revoked_keys` (else
    $QDC_REVOKED_KEYS); None when no key is configured: signatures are then not checked."""
    if trusted_keys is None:
        trusted_keys = os.environ.get(TRUSTED_KEYS_VARIABLE) or None
    elif not _items(trusted_keys):
        raise ValueError("trusted_keys is empty: give key files or keys' text (or None to check no signatures)")
    if revoked_keys is None:
        revoked_keys = os.environ.get(REVOKED_KEYS_VARIABLE) or None
    entries = [k for item in _items(trusted_keys) for k in _read_item(item)]
    for item in _items(revoked_keys):  # key files, keys' text or bare fingerprints
        is_fingerprint = isinstance(item, str) and _FINGERPRINT_RE.match(item.lower())
        entries += [(True, item.lower())] if is_fingerprint else [(True, k) for _, k in _read_item(item)]
    if not entries:
        return None
    revoked = {k if isinstance(k, str) else k.fingerprint for is_revoked, k in entries if is_revoked}
    return Trust([k for is_revoked, k in entries if not is_revoked], revoked)


def signing_key_from(spec=None) -> SigningKey | None:
    """The key of `--sign KEYFILE` (else $QDC_SIGNING_KEY: a key file, or its PEM text), or None."""
    spec = spec or os.environ.get(SIGNING_KEY_VARIABLE) or None
    return None if spec is None else SigningKey.load(spec)


# ---- what is signed, and signature files -------------------------------------------------------

def signed_message(kind: str, body: dict) -> bytes:
    """What a signature of record `body` signs: its kind, the format version and its signed fields,
    sorted by name, each encoded as the record stores it (msgpack keeps a map's order through
    decoding and encoding, so a record read back signs as it was written, in one C call)."""
    content = sorted((k, v) for k, v in body.items() if k not in UNSIGNED_FIELDS)
    return _DOMAIN + msgpack.packb([kind, A.FORMAT_VERSION, content], use_bin_type=True)


def encode_signature(signature: dict) -> bytes:
    return A.encode_record(SIGNATURE_RECORD, signature)


def decode_signature(data: bytes) -> dict:
    """A signature file's content; ValueError if it is not one."""
    body = A.decode_record(data, SIGNATURE_RECORD)
    if not _is_signature(body):
        raise ValueError("malformed signature record")
    return body


def _is_signature(sig) -> bool:
    return (isinstance(sig, dict) and isinstance(sig.get("public_key"), bytes) and len(sig["public_key"]) == 32
            and isinstance(sig.get("signature"), bytes) and len(sig["signature"]) == 64
            and isinstance(sig.get("name"), str))


def check_signature_list(signed) -> list:
    """A module record's "signed" list as parsed signatures (a problem string per malformed one)."""
    if not isinstance(signed, list):
        return ["a malformed signature list"]
    return [sig if _is_signature(sig) else "a malformed signature" for sig in signed[:MAX_SIGNATURES]]


def read_entry_signatures(files, names: list | None = None) -> list:
    """The signatures of an entry (`files`: its EntryFiles), parsed, with a problem string for each
    signature file that is unreadable or not named after its key's fingerprint. `names`: only
    those files, where present (no listing of the entry's folder)."""
    out = []
    if names is None:
        names = sorted(n for n in files.names() if n.startswith(SIGNATURE_PREFIX))[:MAX_SIGNATURES]
    for name in names:
        try:
            sig = decode_signature(files.read(name, max_bytes=MAX_SIGNATURE_BYTES))
            if not SIGNATURE_FILE_RE.match(name) or name != signature_file(fingerprint(sig["public_key"])):
                raise ValueError("not named after its key's fingerprint")
            out.append(sig)
        except FileNotFoundError:
            continue  # one of `names` that is absent (a listed file removed meanwhile is unsigned too)
        except ValueError as e:
            out.append(f"an unreadable signature file {files.where(name)} ({e})")
        except Exception as e:  # noqa: BLE001 (a CacheError of the store: too large, not a file)
            out.append(f"an unreadable signature file ({e})")
    return out


def entry_signature_files(store, key: str) -> dict:
    """File name -> bytes of the readable signature files of entry `key` in `store` (a cache.Store)."""
    files = store.open_entry(key)
    try:
        return {signature_file(fingerprint(sig["public_key"])): encode_signature(sig)
                for sig in read_entry_signatures(files) if not isinstance(sig, str)}
    finally:
        files.close()


def self_consistent(kind: str, body: dict, sig) -> bool:
    """Whether signature `sig` (parsed) matches `body` under its own public key; no trust involved."""
    return not isinstance(sig, str) and PublicKey(sig["public_key"]).verifies(sig["signature"],
                                                                              signed_message(kind, body))


def kept_signatures(kind: str, body: dict, records: list, signer: SigningKey | None = None) -> list:
    """The signatures a rewritten record `body` carries: those of `records` (the one it replaces,
    the shards' it merges; None skipped) whose signed content is the same as its own, one per
    key, and `signer`'s. No key or cryptography is needed to keep a signature."""
    message, out = signed_message(kind, body), {}
    for record in records:
        if record is None or not isinstance(record.get("signed"), list) or signed_message(kind, record) != message:
            continue
        for sig in check_signature_list(record["signed"]):
            if not isinstance(sig, str):
                out.setdefault(fingerprint(sig["public_key"]), sig)
    if signer is not None:
        out[signer.public.fingerprint] = signer.sign(kind, body)
    return [out[fp] for fp in sorted(out)]


def entry_digest(record: dict) -> str:
    """What a module record's statement holds of an entry record: the sha256 of its signed message."""
    return hashlib.sha256(signed_message(A.ENTRY_RECORD, record)).hexdigest()


def _attestation_message(module_record: dict, statement: dict) -> bytes:
    return signed_message(ATTESTATION, _attestation_body(module_record, statement))


def _attestation_body(module_record: dict, statement: dict) -> dict:
    return {"module": module_record.get("module"), "arch": module_record.get("arch"), "digests": statement["digests"]}


def describe_attestations(module_record: dict, entry_record: dict, trust: "Trust | None") -> list[str]:
    """One line per statement of `module_record` that gives `entry_record`'s digest: who signed it
    and whether that holds (as describe_signatures)."""
    digest, lines = entry_digest(entry_record), []
    statements = module_record.get("attested", [])
    for st in statements if isinstance(statements, list) else ():
        if isinstance(st, dict) and isinstance(st.get("digests"), dict) and _is_signature(st.get("signature")) \
                and st["digests"].get(entry_record.get("key")) == digest:
            lines += describe_signatures(ATTESTATION, _attestation_body(module_record, st), [st["signature"]], trust)
    return lines


def sign_module(body: dict, entries: dict, records: list, signer: SigningKey | None = None) -> dict:
    """Module record `body` with its signatures: those of `records` (the record it replaces, the
    shards' it merges) that still hold (kept_signatures) and `signer`'s; and the statements of
    entry digests (`entries`: key -> the entry records at hand) that still cover one of them,
    `signer`'s first, each kept only where it covers an entry that those before it do not."""
    out = {k: v for k, v in body.items() if k not in ("signed", "attested")}
    signed = kept_signatures(A.MODULE_RECORD, out, records, signer)
    current = {key: entry_digest(record) for key, record in sorted(entries.items())}
    statements = []
    if signer is not None and current:
        statement = {"digests": current}
        statement["signature"] = signer.sign(ATTESTATION, _attestation_body(out, statement))
        statements.append(statement)
    for record in records:
        kept = record.get("attested", []) if isinstance(record, dict) else []
        statements += [st for st in kept if isinstance(st, dict) and isinstance(st.get("digests"), dict)]
    attested, covered = [], set()
    for st in statements:
        pairs = {(k, d) for k, d in st["digests"].items() if current.get(k) == d} - covered
        if pairs and st not in attested:
            attested.append(st)
            covered |= pairs
    return {**out, **({"signed": signed} if signed else {}), **({"attested": attested} if attested else {})}


def describe_signatures(kind: str, body: dict, signatures: list, trust: Trust | None) -> list[str]:
    """One line per signature, for `qdc inspect` and `qdc verify`: who signed and whether it holds."""
    lines = []
    for sig in signatures:
        if isinstance(sig, str):
            lines.append(sig)
            continue
        key = PublicKey(sig["public_key"], sig["name"])
        if not self_consistent(kind, body, sig):
            state = "does NOT match the content (altered after signing)"
        elif trust is None:
            state = "valid (no trusted keys given to judge the key)"
        elif key.fingerprint in trust.trusted:
            state = "valid, trusted key"
        elif key.fingerprint in trust.revoked:
            state = "valid, REVOKED key"
        else:
            state = "valid, unknown key"
        lines.append(f"signed by {key.describe()}: {state}")
    return lines or ["unsigned"]
