"""Kernel manifests: the kernel variants a program instantiates, recorded while it runs
(recording.py: `qdc record`, QDC_RECORD) and kept as readable YAML (manifest_file.py); built
ahead of time from it by compiler/commands/build_manifest.py (`qdc build --manifest`). A floor
between compiler/driver and compiler/jit: jit records each variant it compiles or loads."""
