"""Kernel manifests: the kernel variants a program instantiates, recorded while it runs
(recording.py: `qdc record`, QDC_RECORD), kept as readable YAML (manifest_file.py) and built
ahead of time from it (building.py: `qdc build --manifest`)."""
