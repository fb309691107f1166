"""The `qdc` command (docs/api.md): build, record, ls, inspect, verify, clean, pack, merge, push, pull,
keygen.

Exit codes: 0 success, 1 a build or verify failure, 2 a usage error. Options come from flags,
then `qdc.yaml` / `[tool.qdc]` in pyproject.toml (nearest to the working folder), then
defaults. Only `build`, `inspect --llvm` and `inspect --spirv` import the compiler.
"""
from __future__ import annotations

import datetime
import functools
import os
import sys

import click

DEFAULT_CACHE = "./cache"
INT_TYPES = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]


def _config() -> tuple[str | None, dict]:
    from qdc.compiler.driver.options import ConfigError, find_config
    try:
        return find_config(os.getcwd())
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def _cache_dir(flag: str | None) -> str:
    """--cache, else `cache_dir` from the configuration file, else ./cache."""
    return flag or _config()[1].get("cache_dir") or DEFAULT_CACHE


def _remote(flag: str | None) -> str | None:
    """--remote, else $QDC_REMOTE, else `remote` from the configuration file, else none."""
    from qdc.runtime.remote import REMOTE_VARIABLE
    return flag or os.environ.get(REMOTE_VARIABLE) or _config()[1].get("remote")


def _remote_store(url: str):
    from qdc.runtime.remote import RemoteStore
    try:
        return RemoteStore(url)
    except ImportError as e:
        raise click.UsageError(str(e)) from None
    except Exception as e:  # noqa: BLE001 (a CacheError naming the URL)
        _fail(str(e))


REMOTE_HELP = "Remote store URL (s3://, gs://, az://, http(s)://, file://). Default: $QDC_REMOTE, `remote:` in qdc.yaml."


KEYS_HELP = ("Public key files (from `qdc keygen`) or key text, comma-separated or repeated. Default: "
             "$QDC_TRUSTED_KEYS, `trusted_keys` in qdc.yaml.")
REVOKED_HELP = "Revoked keys (key files, key text or fingerprints). Default: $QDC_REVOKED_KEYS, `revoked_keys`."
SIGN_HELP = "Sign with this private key (from `qdc keygen`). Default: $QDC_SIGNING_KEY."


def _trust_options(command):
    """--trusted-keys and --revoked-keys, passed to the command as `trust` (runtime/signing.py)."""
    @functools.wraps(command)  # its click options too
    def with_trust(*args, trusted_keys=(), revoked_keys=(), **kwargs):
        return command(*args, trust=_trust(trusted_keys, revoked_keys), **kwargs)
    with_trust = click.option("--revoked-keys", multiple=True, metavar="KEYS", help=REVOKED_HELP)(with_trust)
    return click.option("--trusted-keys", multiple=True, metavar="KEYS", help=KEYS_HELP)(with_trust)


def _trust(trusted_keys=(), revoked_keys=()):
    """The Trust of flags, else the environment, else the configuration file; None without keys."""
    from qdc.runtime.signing import trust_from
    config = _config()[1]
    try:
        return trust_from(list(trusted_keys) or config.get("trusted_keys"),
                          list(revoked_keys) or config.get("revoked_keys"))
    except (ImportError, TypeError, ValueError) as e:  # no cryptography, or a key that cannot be read
        raise click.UsageError(str(e)) from None


def _signer(spec):
    """The signing key of --sign KEYFILE (else $QDC_SIGNING_KEY), or None; a usage error if unusable."""
    from qdc.runtime.signing import signing_key_from
    try:
        return signing_key_from(spec)
    except (ImportError, ValueError) as e:
        raise click.UsageError(str(e)) from None


def _fail(message: str) -> None:
    click.echo(f"qdc: error: {message}", err=True)
    sys.exit(1)


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 kernel', '2 kernels' ('1 entry', '2 entries' with the plural given)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _date(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qdc", prog_name="qdc")
def cli():
    """qdc: ahead-of-time compiler for Quadrants-style Python kernels."""
    # A kernel's source line in an error, or a path, may hold characters the terminal's locale
    # cannot encode (an ASCII locale): print them escaped rather than fail on the report itself.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


# ---- build -------------------------------------------------------------------------------------

def _target_flag(option):
    """The `qdc build` flag of a target's option (compiler/targets/base.py, TargetOption): its
    value checked by the option's own check, so that a bad value is a usage error."""
    def callback(ctx, param, value):
        try:
            option.check(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        return value
    choices = None if option.choices is None else "[" + "|".join(map(str, option.choices)) + "]"
    return click.Option([option.flag], type=option.type, metavar=choices, callback=callback, help=option.help)


class _BuildCommand(click.Command):
    """`qdc build`, whose --arch help and target flags (--cpu-target, --cuda-arch, ...) come from
    the arch table and the options each target declares, read when the command runs."""

    def get_params(self, ctx):
        if "qdc_build_params" not in ctx.meta:
            from qdc.compiler.driver.options import target_options
            from qdc.runtime.contract.arches import names
            arch = click.Option(["--arch"],
                                help=f"Comma-separated arches ({','.join(names())}) or 'all'. Default: cpu.")
            flags = [_target_flag(option) for _, option in target_options().values()]
            own = super().get_params(ctx)
            helps = [p for p in own if p.name == "help"]
            rest = [p for p in own if p.name != "help"]
            ctx.meta["qdc_build_params"] = rest[:1] + [arch] + rest[1:] + flags + helps
        return ctx.meta["qdc_build_params"]


@cli.command(cls=_BuildCommand)
@click.argument("paths", nargs=-1)
@click.option("--manifest", "manifest", metavar="FILE",
              help="Build exactly the kernel variants of a manifest recorded by `qdc record` (instead of PATHS).")
@click.option("--cache", "cache_dir", help=f"Cache folder to write. Default: {DEFAULT_CACHE}.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Compile in N processes. Default: CPU count.")
@click.option("--force", is_flag=True, help="Recompile even kernels whose entries are cached.")
@click.option("--shard", metavar="K/N", help="Build only shard K of N (a stable split of kernel x arch).")
@click.option("--remote", "remote_url", metavar="URL", help=REMOTE_HELP)
@click.option("-v", "--verbose", is_flag=True, help="Name each cache hit too, not only each kernel compiled.")
@click.option("--timings", "show_timings", is_flag=True,
              help="Print where each kernel's build time went, per phase and arch, largest kernels first.")
@click.option("--opt-level", type=click.IntRange(0, 3), help="LLVM optimisation level (default 3).")
@click.option("--fast-math/--no-fast-math", default=None, help="Allow float reassociation (default off).")
@click.option("--debug/--no-debug", default=None, help="Bounds checks on every global access.")
@click.option("--default-fp", type=click.Choice(["f16", "f32", "f64"]), help="Type of float literals (f32).")
@click.option("--default-ip", type=click.Choice(INT_TYPES), help="Type of int literals (i32).")
@click.option("--ad-stack-size", type=click.IntRange(min=0), help="Force N adstack slots (0: sized by the compiler).")
@click.option("--default-ad-stack-size", type=click.IntRange(min=1), help="Fallback adstack capacity (256).")
@click.option("--ad-stack-strict/--no-ad-stack-strict", default=None, help="Unsized adstacks are errors.")
@click.option("--sign", "sign_key", metavar="KEYFILE", help=SIGN_HELP + " Signs every entry and module record.")
@click.option("--trusted-keys", help="Keys whose signed entries a remote may supply (with --sign, that key too).")
def build(paths, manifest, arch, cache_dir, jobs, force, verbose, shard, remote_url, show_timings, sign_key,
          **flags):
    """Compile every kernel in PATHS (.py files or folders), or every kernel variant of a
    manifest (--manifest FILE), into the cache."""
    from qdc.compiler.commands import build as build_mod
    from qdc.compiler.driver.options import ConfigError, resolve
    if bool(paths) == bool(manifest):
        raise click.UsageError("give kernel PATHS or --manifest FILE (one of them)")
    source, file_values = _config()
    file_values = dict(file_values)
    # a manifest builds the arches it recorded unless told otherwise
    arch_spec = arch or file_values.pop("arch", None) or (None if manifest else "cpu")
    file_values.pop("arch", None)
    remote_url = remote_url or os.environ.get("QDC_REMOTE") or file_values.get("remote")
    file_values.pop("remote", None)
    cache_dir = cache_dir or file_values.get("cache_dir") or DEFAULT_CACHE
    try:
        opts = resolve(flags, file_values, source or "configuration file")
        arches = None if arch_spec is None else build_mod.resolve_arches(arch_spec)
        shard = build_mod.parse_shard(shard)
        # `all` means every arch that can express each kernel: the others skip it (an arch named
        # explicitly must build every kernel)
        how = dict(log=lambda text: click.echo(text, err=True), out=click.echo, verbose=verbose,
                   skip_unexpressible=arch_spec is not None and build_mod.means_every_arch(arch_spec), shard=shard,
                   remote=remote_url, show_timings=show_timings,
                   signer=_signer(sign_key))
        if manifest:
            from qdc.compiler.commands.build_manifest import build_manifest
            _quadrants_alias(manifest)
            report = build_manifest(manifest, arches, opts, cache_dir, jobs or os.cpu_count() or 1, force, **how)
        else:
            report = build_mod.build(list(paths), arches, opts, cache_dir, jobs or os.cpu_count() or 1, force, **how)
    except (ConfigError, build_mod.BuildUsageError) as e:
        raise click.UsageError(str(e)) from None
    sys.exit(0 if report.ok else 1)


def _quadrants_alias(manifest: str) -> None:
    """A program recorded while it ran with qdc as quadrants (qdc.install_as_quadrants()) has its
    modules imported that way here too."""
    from qdc.compiler.manifest import manifest_file
    try:
        as_quadrants = manifest_file.read(manifest).as_quadrants
    except manifest_file.ManifestError:
        return  # the build reports it
    if as_quadrants:
        import qdc
        qdc.install_as_quadrants()


# ---- record ------------------------------------------------------------------------------------

@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "output", metavar="FILE", required=True, help="The manifest to write.")
@click.option("--append", is_flag=True, help="Merge into FILE instead of starting it afresh.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def record(output, append, command):
    """Run COMMAND (after --) and write a manifest of every kernel variant it compiled or loaded,
    for `qdc build --manifest FILE`. Processes COMMAND starts record into FILE too."""
    import subprocess
    from qdc.compiler.manifest import manifest_file
    from qdc.compiler.manifest.recording import RECORD_VARIABLE
    path = os.path.abspath(output)
    if os.path.isdir(path):
        raise click.UsageError(f"{output} is a folder: -o takes the manifest file to write")
    try:
        if append and os.path.exists(path):
            manifest_file.read(path)  # refuse to merge into something that is not a manifest
        else:  # a new manifest; each process of COMMAND adds its entries at its exit
            with open(path, "w", encoding="utf-8") as f:
                f.write(manifest_file.dumps([]))
    except (OSError, manifest_file.ManifestError) as e:
        raise click.UsageError(str(e)) from None
    try:
        code = subprocess.call(list(command), env={**os.environ, RECORD_VARIABLE: path})
    except OSError as e:
        _fail(f"cannot run {command[0]}: {e}")
    entries = manifest_file.read(path)
    click.echo(f"qdc record: {len(entries)} kernel variants in {output}", err=True)
    sys.exit(code)


# ---- ls / inspect --------------------------------------------------------------------------------

@cli.command("ls")
@click.option("--cache", "cache_dir", help="Cache folder or bundle. Default: ./cache.")
@click.option("--remote", "remote_url", metavar="URL", help="List this remote store instead of the cache.")
def ls_cmd(cache_dir, remote_url):
    """List built modules, their kernels, arches, sizes and build dates."""
    from qdc.runtime import cache as C
    store = _remote_store(remote_url) if remote_url else _open(cache_dir)
    referenced = set()
    modules = C.list_modules(store)
    if not modules:
        click.echo(f"{store.location}: no built modules")
    for module, arch in modules:
        try:
            record = C.read_module(store, module, arch)
        except (C.CacheError, ValueError) as e:
            click.echo(f"{module} ({arch}): unreadable: {e}")
            continue
        rows = []
        for kernel, key in record["kernels"].items():
            referenced.add(key)
            size, created = _entry_size_and_date(store, key)
            rows.append(f"  {kernel:<24} {_human(size):>10}  {_date(created)}  {key[:12]}")
        skipped = record.get("skipped")  # by `qdc build --arch all`: the arch cannot express them
        for kernel, reason in sorted(skipped.items() if isinstance(skipped, dict) else []):
            rows.append(f"  {kernel:<24} {'skipped':>10}  {reason}")
        total = sum(_entry_size_and_date(store, k)[0] for k in record["kernels"].values())
        click.echo(f"{module} ({arch}): {_count(len(record['kernels']), 'kernel')}, {_count(len(record['fields']), 'field')}, "
                   f"{_human(total)}, built {_date(record.get('built', 0))}")
        for row in rows:
            click.echo(row)
    if isinstance(store, C.Cache):
        entries = store.entries()
        loose = [e for e in entries if e["key"] not in referenced]
        click.echo(f"{_count(len(entries), 'entry', 'entries')}, {_human(sum(e['size'] for e in entries))} in {store.location}"
                   f" ({len(loose)} not in any module: direct-mode compiles or older builds)")


def _open(cache_dir):
    from qdc.runtime import cache as C
    from qdc.runtime.bundle import open_store
    location = _cache_dir(cache_dir)
    try:
        store = open_store(location)
    except (FileNotFoundError, C.CacheError) as e:
        _fail(str(e))
    return C.Cache(location) if isinstance(store, C.DirStore) else store


def _existing_cache_folder(cache_dir) -> str:
    """The cache folder `clean` and `pack` work on: a usage error if it is a file, exit 1 if absent."""
    from qdc.runtime import cache as C
    location = _cache_dir(cache_dir)
    try:
        C.check_cache_folder(location)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if not os.path.isdir(location):
        _fail(f"no qdc cache folder at '{location}'")
    return location


def _entry_size_and_date(store, key: str) -> tuple[int, float]:
    from qdc.runtime import cache as C
    from qdc.runtime.contract.artifact import ENTRY_RECORD
    try:
        record = C.read_record(store, f"{C.entry_path(key)}/{C.META_FILE}", ENTRY_RECORD)
    except (FileNotFoundError, C.CacheError):
        return 0, 0.0
    return sum(a["size"] for a in record["artifacts"].values()), record.get("created", 0)


VIEWS = {"ir": "ir", "llvm": "bc", "spirv": "spv", "msl": "msl", "ptx": "ptx"}


@cli.command()
@click.argument("target", metavar="MODULE.KERNEL")
@click.option("--arch", default="cpu", show_default=True)
@click.option("--cache", "cache_dir", help="Cache folder or bundle. Default: ./cache.")
@click.option("--ir", "view", flag_value="ir", help="The optimised qdc IR.")
@click.option("--llvm", "view", flag_value="llvm", help="LLVM IR (disassembled from the stored bitcode).")
@click.option("--spirv", "view", flag_value="spirv", help="SPIR-V (via spirv-dis).")
@click.option("--msl", "view", flag_value="msl", help="Metal shading language.")
@click.option("--ptx", "view", flag_value="ptx", help="PTX.")
@click.option("--amdgcn", "view", flag_value="amdgcn", help="AMDGPU assembly of each code object.")
@click.option("--size-expr", "view", flag_value="size-expr", help="Adstack sizing (SizeExpr trees).")
@_trust_options
def inspect(target, arch, cache_dir, view, trust):
    """Show a built kernel's metadata, or one of its artifacts in readable form.
    MODULE.KERNEL.grad names the reverse-mode variant."""
    from qdc.runtime import cache as C
    module, _, kernel = target.partition(".")
    if not module or not kernel:
        raise click.UsageError(f"'{target}': name a kernel as MODULE.KERNEL, e.g. saxpy.saxpy")
    store = _open(cache_dir)
    try:
        record = C.read_module(store, module, arch)
        if kernel not in record["kernels"]:
            _fail(f"module '{module}' ({arch}) has no kernel '{kernel}' (kernels: "
                  f"{', '.join(record['kernels'])})")
        entry = C.read_entry(store, record["kernels"][kernel])
    except (FileNotFoundError, C.CacheError, ValueError) as e:
        _fail(str(e))
    if view is None:
        click.echo(_describe_entry(entry))
        click.echo(f"  launch    {_launch_path(store.location, module, kernel, arch)}")
        click.echo(_describe_signers(store, entry, record, trust))
    elif view == "size-expr":
        from qdc.runtime.adstack import describe_stacks
        click.echo(describe_stacks(entry.meta))
        gradient = f"{kernel}.grad"
        if gradient in record["kernels"]:  # adstacks live in the gradient: show them for KERNEL too
            try:
                click.echo(f"{target}.grad: " + describe_stacks(C.read_entry(store, record["kernels"][gradient]).meta))
            except (FileNotFoundError, C.CacheError, ValueError) as e:
                _fail(str(e))
    else:
        click.echo(_artifact_text(entry, view, arch), nl=False)


def _launch_path(location: str, module: str, kernel: str, arch: str) -> str:
    """How the kernel's launches go on this machine's `arch` device, and why (runtime/launch_path.py),
    or why that is not known here."""
    from qdc.runtime.loader import launch_path, load
    try:
        return str(launch_path(load(location, module, arch=arch), kernel))
    except Exception as e:  # noqa: BLE001 (no such device here, a module this host cannot run: said, not raised)
        return f"not known here: {e}"


def _artifact_text(entry, view: str, arch: str) -> str:
    if view == "spirv":
        return _spirv_text(entry, arch)
    if view in ("msl", "amdgcn"):
        return _per_target_text(entry, view, arch)
    kind = VIEWS[view]
    data = entry.artifacts.get(kind)
    if data is None:
        _fail(f"no {view} artifact for arch '{arch}' (stored: {', '.join(sorted(entry.record['artifacts']))})")
    if view == "llvm":
        import llvmlite.binding as llvm
        return str(llvm.parse_bitcode(data))
    return data.decode()


def _spirv_text(entry, arch: str) -> str:
    """spirv-dis of every task's module (`spirv_t<i>`), each under a comment naming its task."""
    modules = sorted((int(k[len("spirv_t"):]), k) for k in entry.record["artifacts"] if k.startswith("spirv_t"))
    if not modules:
        _fail(f"no spirv artifact for arch '{arch}' (stored: {', '.join(sorted(entry.record['artifacts']))})")
    from qdc.compiler.targets.spirv import tools
    parts = []
    for i, kind in modules:
        try:
            text = tools.disassemble(entry.artifacts[kind])
        except RuntimeError as e:
            _fail(str(e))
        parts.append(f"; task {i} ({entry.meta.tasks[i].name})\n{text}")
    return "\n".join(parts)


def _per_target_text(entry, view: str, arch: str) -> str:
    """Metal: every task's MSL (`msl_t<i>`) under a comment naming its task; AMDGPU: every code
    object's assembly."""
    kinds = entry.record["artifacts"]
    if view == "amdgcn":
        from qdc.compiler.targets.amdgpu.disassemble import code_objects, disassembly
        if not code_objects(kinds):
            _fail(f"no amdgcn code object for arch '{arch}' (stored: {', '.join(sorted(kinds))})")
        return disassembly(entry.artifacts)
    sources = sorted((int(k[len("msl_t"):]), k) for k in kinds if k.startswith("msl_t"))
    if not sources:
        _fail(f"no msl artifact for arch '{arch}' (stored: {', '.join(sorted(kinds))})")
    return "\n".join(f"// task {i} ({entry.meta.tasks[i].name})\n{entry.artifacts[k].decode()}" for i, k in sources)


def _describe_entry(entry) -> str:
    r, m = entry.record, entry.meta
    lines = [f"kernel {m.name} ({r['variant']}, {r['arch']})", f"  key       {entry.key}",
             f"  source    {r.get('source', '?')}", f"  compiler  {r.get('compiler', '?')}",
             f"  created   {_date(r.get('created', 0))}",
             "  options   " + ", ".join(f"{k}={v}" for k, v in sorted(r.get("options", {}).items()))]
    from qdc.runtime.vector_arguments import describe_element_type, describe_struct
    for p in (m.params[a.first] for a in m.arguments):  # a vector or struct parameter's scalars are one argument
        kind = p.dtype if p.kind == "scalar" else f"ndarray({p.dtype}, ndim={p.ndim}" + \
            (", needs_grad)" if p.needs_grad else ")")
        if p.name in m.structs:
            kind = describe_struct(m.structs[p.name])
        elif p.is_element:
            kind = describe_element_type(p)
        lines.append(f"  param     {p.name}: {kind}")
    for f in m.fields:
        lines.append(f"  field     {f.name}: {f.dtype}{list(f.shape)}")
    for t in m.tasks:
        lines.append(_describe_task(t, m))
    for lib in getattr(m, "cpu_libraries", None) or []:
        needs = ", ".join(lib["features"]) or "nothing beyond the baseline"
        platform = f"{lib['machine']}-{lib.get('os', 'linux')}" + (f", {lib['triple']}" if "triple" in lib else "")
        lines.append(f"  library   {lib['artifact']} for {lib['target']} ({platform}): needs {needs}")
    width = max([12] + [len(a["file"]) for a in r["artifacts"].values()])
    for kind, a in sorted(r["artifacts"].items()):
        lines.append(f"  artifact  {a['file']:<{width}} {_human(a['size']):>10}  sha256 {a['sha256']}")
    return "\n".join(lines)


def _describe_signers(store, entry, record, trust) -> str:
    """Who signed the entry and its module record, and whose signed statement in the module
    record gives the entry's digest; whether each holds (judged against `trust` when keys are given)."""
    from qdc.runtime import signing
    from qdc.runtime.contract.artifact import ENTRY_RECORD, MODULE_RECORD
    files = store.open_entry(entry.key)
    try:
        signed = signing.read_entry_signatures(files)
    finally:
        files.close()
    module = signing.check_signature_list(record.get("signed", []))
    lines = [f"  {'attested':<9} in the module record: {line}"
             for line in signing.describe_attestations(record, entry.record, trust)] if signing.available() else []
    for what, kind, body, signatures in (("signed", ENTRY_RECORD, entry.record, signed),
                                         ("module", MODULE_RECORD, record, module)):
        if signatures and not signing.available():
            lines += [f"  {what:<9} {len(signatures)} signature(s), not checked: {signing.EXTRA_HINT}"]
            continue
        lines += [f"  {what:<9} {line}" for line in signing.describe_signatures(kind, body, signatures, trust)]
    return "\n".join(lines)


def _describe_task(t, m) -> str:
    """One task record: kind, entry symbol, trip count, launch policy, adstacks."""
    from qdc.runtime.adstack import describe_launch
    from qdc.runtime.contract import sizeexpr as se
    tree = se.from_nodes(t.iterations)
    trip = "unknown" if tree is None else se.to_text(tree, m.record_names(), [f.name for f in m.fields])
    serial = " serial" if t.serial and t.kind != "serial" else ""
    stacks = f", adstacks {t.adstacks}" if t.adstacks else ""
    return (f"  task      {t.name}: {t.kind}{serial}, entry {t.entry}, {trip} iterations, "
            f"on {describe_launch(t.launch)}{stacks}")


# ---- verify / clean / pack ---------------------------------------------------------------------

@cli.command()
@click.argument("source", required=False, metavar="[DIR|BUNDLE]")
@click.option("--cache", "cache_dir", help="Cache folder or bundle. Default: ./cache.")
@click.option("--remote", "remote_url", metavar="URL", help="Verify this remote store (downloads everything).")
@_trust_options
def verify(source, cache_dir, remote_url, trust):
    """Check every artifact against its recorded hash and format version, and every module
    record against the entries it names (kernel, variant, fields), that each artifact defines
    exactly the entry points its record names, and names stray files where they are. DIR|BUNDLE:
    the same as --cache. With trusted keys, reports who signed each entry and module record
    and fails on any that no trusted key signed."""
    from qdc.runtime.verify import verify_store
    if source is not None and cache_dir is not None:
        raise click.UsageError("name the cache or bundle once: either DIR|BUNDLE or --cache")
    if remote_url is not None and (source is not None or cache_dir is not None):
        raise click.UsageError("name one store: DIR|BUNDLE, --cache or --remote")
    store = _remote_store(remote_url) if remote_url else _open(source if source is not None else cache_dir)
    states = [] if trust is not None else None
    try:
        checked, problems = verify_store(store, trust, states)
    except Exception as e:  # noqa: BLE001 (a remote that cannot be listed: a CacheError naming it)
        _fail(str(e))
    for path, state in states or ():
        click.echo(f"{path}: {state}")
    for path, reason in problems:
        click.echo(f"{path}: {reason}", err=True)
    click.echo(f"qdc verify: {_count(checked, 'file')} checked in {store.location}, {len(problems)} bad")
    sys.exit(1 if problems else 0)


@cli.command()
@click.option("--cache", "cache_dir", help="Cache folder. Default: ./cache.")
@click.option("--max-size", help="Evict least-recently-used entries until the cache is at most SIZE (e.g. 500M).")
@click.option("--all", "everything", is_flag=True, help="Remove every entry and module record.")
@click.option("--remote", "remote_url", metavar="URL", help="Expire objects of this remote store (--older-than).")
@click.option("--older-than", metavar="AGE", help="With --remote: delete what was written more than AGE ago "
                                                   "(e.g. 30d, 12h) and is named by no newer module record.")
def clean(cache_dir, max_size, everything, remote_url, older_than):
    """Evict least-recently-used entries down to SIZE, or everything; or expire a remote's old objects."""
    from qdc.runtime import cache as C
    if remote_url is not None or older_than is not None:
        _clean_remote(remote_url, older_than, max_size, everything)
        return
    if (max_size is None) == (not everything):
        raise click.UsageError("give either --max-size SIZE or --all")
    try:
        limit = None if everything else C.parse_size(max_size)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    location = _existing_cache_folder(cache_dir)
    problem = C.writable_problem(location)
    if problem is not None:
        raise click.UsageError(f"cache folder '{location}' is not writable ({problem}): nothing to clean there")
    stats = C.Cache(location).clean(max_size=limit, everything=everything)
    dropped = f"; module records dropped: {', '.join(stats['modules_dropped'])}" if stats["modules_dropped"] else ""
    click.echo(f"qdc clean: evicted {stats['evicted']} entries and "
               f"{_count(stats['sources_evicted'], 'parsed-source record')}, {_human(stats['remaining_bytes'])} "
               f"left{dropped}")


def _clean_remote(remote_url, older_than, max_size, everything) -> None:
    from qdc.runtime.remote import clean_remote
    if remote_url is None or older_than is None or max_size is not None or everything:
        raise click.UsageError("a remote store is cleaned with --remote URL --older-than AGE (alone)")
    try:
        seconds = _parse_age(older_than)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        stats = clean_remote(_remote_store(remote_url), seconds)
    except Exception as e:  # noqa: BLE001 (CacheError naming the object)
        _fail(str(e))
    click.echo(f"qdc clean: deleted {_count(stats['evicted'], 'entry', 'entries')}, "
               f"{_count(stats['modules_dropped'], 'module record')} and "
               f"{_count(stats['sources_evicted'], 'parsed-source record')} from {remote_url}")


def _parse_age(text: str) -> float:
    """'30d', '12h', '45m', '90s' (or seconds) -> seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    t = str(text).strip().lower()
    mult = units.get(t[-1:], 1)
    try:
        value = float(t[:-1] if t[-1:] in units else t)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"invalid age {text!r}: use a number with d, h, m or s (e.g. 30d)")
    return value * mult


@cli.command()
@click.option("--cache", "cache_dir", help="Cache folder. Default: ./cache.")
@click.option("--remote", "remote_url", metavar="URL", help="Pack the modules of this remote store instead.")
@click.option("-o", "--output", required=True, help="Bundle file to write (e.g. kernels.qdc.tar.gz).")
@click.option("--sign", "sign_key", metavar="KEYFILE", help="Also sign every module record and entry packed.")
def pack(cache_dir, output, remote_url, sign_key):
    """Write the built modules into one reproducible bundle for deployment."""
    from qdc.runtime import cache as C
    from qdc.runtime.bundle import pack as pack_bundle
    store = _remote_store(remote_url) if remote_url else C.Cache(_existing_cache_folder(cache_dir))
    try:
        stats = pack_bundle(store, output, _signer(sign_key) if sign_key else None)
    except (C.CacheError, FileNotFoundError, ValueError) as e:
        _fail(f"{e} (nothing was packed; run `qdc verify`)")
    click.echo(f"qdc pack: {_count(stats['modules'], 'module record')}, "
               f"{_count(stats['sources'], 'parsed-source record')}, {_count(stats['files'], 'file')}, "
               f"{_human(stats['bytes'])} -> {output}")


# ---- merge / push / pull -----------------------------------------------------------------------

@cli.command()
@click.argument("dest")
@click.argument("sources", nargs=-1, required=True)
@click.option("--sign", "sign_key", metavar="KEYFILE", help="Also sign every merged module record (and through "
                                                            "it the digests of its entries).")
def merge(dest, sources, sign_key):
    """Union the caches SOURCES (the shards of one build, say) into cache folder DEST, keeping
    their signatures."""
    from qdc.runtime import cache as C
    from qdc.runtime.bundle import open_store
    from qdc.runtime.merge import merge as merge_caches
    try:
        root = C.check_cache_folder(dest)
        stores = [open_store(s) for s in sources]
    except C.CacheError as e:  # a bundle refused whole
        _fail(f"{e}: nothing was merged")
    except (FileNotFoundError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    try:
        stats = merge_caches(C.Cache(root), stores, _signer(sign_key) if sign_key else None)
    except (C.CacheError, OSError) as e:
        _fail(str(e))
    for record in stats["unsigned"]:
        click.echo(f"qdc merge: warning: the merged record of {record} matches no source's signed record and is "
                   f"unsigned: give --sign KEYFILE", err=True)
    if stats["sources_refused"]:
        click.echo(f"qdc merge: warning: {_count(stats['sources_refused'], 'parsed-source record')} refused (damaged "
                   f"or misplaced) and left out: the processes that need them parse those sources", err=True)
    click.echo(f"qdc merge: {_count(stats['entries'], 'entry', 'entries')}, "
               f"{_count(stats['modules'], 'module record')} and "
               f"{_count(stats['sources'], 'parsed-source record')} merged into {dest}")


@cli.command()
@click.option("--cache", "cache_dir", help="Cache folder. Default: ./cache.")
@click.option("--remote", "remote_url", metavar="URL", help=REMOTE_HELP)
def push(cache_dir, remote_url):
    """Upload the cache's entries, then every module record whose entries are all on the remote."""
    from qdc.runtime import cache as C
    from qdc.runtime.remote import push_all
    url = _remote(remote_url) or _no_remote()
    store = _remote_store(url)
    try:
        stats = push_all(store, C.Cache(_existing_cache_folder(cache_dir)), log=lambda t: click.echo(t, err=True))
    except Exception as e:  # noqa: BLE001 (CacheError naming the object)
        _fail(str(e))
    for line in stats["incomplete"]:
        click.echo(f"qdc push: not uploaded yet, entries missing on the remote: {line}", err=True)
    click.echo(f"qdc push: {_count(stats['entries'], 'entry', 'entries')}, {_count(stats['modules'], 'module record')}, "
               f"{_count(stats['sources'], 'parsed-source record')} -> {url}")


@cli.command()
@click.argument("modules", nargs=-1)
@click.option("--arch", default="cpu", show_default=True)
@click.option("--cache", "cache_dir", help="Cache folder to fill. Default: ./cache.")
@click.option("--remote", "remote_url", metavar="URL", help=REMOTE_HELP)
@_trust_options
def pull(modules, arch, cache_dir, remote_url, trust):
    """Fetch MODULES (default: every module built for --arch) and their entries, verified, into the cache."""
    from qdc.runtime import cache as C
    from qdc.runtime.remote import pull_module, pull_source_records
    url = _remote(remote_url) or _no_remote()
    store = _remote_store(url)
    cache = C.Cache(_cache_dir(cache_dir))
    try:
        names = modules or [m for m, a in C.list_modules(store) if a == arch]
        fetched = sum(pull_module(store, cache, m, arch, trust) for m in names)
        sources, _ = pull_source_records(store, cache)
    except Exception as e:  # noqa: BLE001 (CacheError / ModuleNotBuiltError naming the object)
        _fail(str(e))
    click.echo(f"qdc pull: {_count(len(names), 'module')} ({arch}), {_count(fetched, 'entry', 'entries')} and "
               f"{_count(sources, 'parsed-source record')} fetched into {cache.root}")


# ---- keys ----------------------------------------------------------------------------------------

@cli.command()
@click.argument("keyfile")
@click.option("--name", help="The key's name, shown beside its fingerprint by `qdc inspect`. Default: KEYFILE's.")
def keygen(keyfile, name):
    """Create an Ed25519 key pair: KEYFILE, the private key (mode 0600: keep it secret, give it to
    `qdc build --sign`), and KEYFILE.pub, the public key deployments trust (`trusted_keys`)."""
    from qdc.runtime.signing import keygen as make_key
    try:
        key = make_key(keyfile, name)
    except ImportError as e:
        raise click.UsageError(str(e)) from None
    except (FileExistsError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        _fail(f"cannot write '{keyfile}': {e.strerror or e}")
    click.echo(f"qdc keygen: private key {keyfile} (keep it secret), public key {keyfile}.pub")
    click.echo(f"fingerprint {key.public.fingerprint}  {key.public.name}")


def _no_remote():
    raise click.UsageError("no remote store: give --remote URL, set QDC_REMOTE or `remote:` in qdc.yaml")


def main(argv=None):
    cli.main(args=argv, prog_name="qdc")


if __name__ == "__main__":
    main()
