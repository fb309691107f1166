#!/bin/bash
# Packs the tree under test (default: this checkout's tracked + untracked non-ignored files; `pack.sh
# DIR`: another worktree's, e.g. a clean `git worktree` while this one is being edited) into
# .gpu/tree.tar, which setup.sh unpacks on the offline GPU host.
root="$(dirname "$(readlink -f "$0")")/../.."
mkdir -p "$root/.gpu"
cd "${1:-$root}" && git ls-files -co --exclude-standard -z | tar --null -T - -cf "$root/.gpu/tree.tar" && ls -la "$root/.gpu/tree.tar"
