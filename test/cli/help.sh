#!/bin/bash
# Keeps the programs' command lines from rotting: PROGRAM [COMMAND] --help
# exits 0 and lists every OPTION named here, and PROGRAM --version exits 0
# and prints grad's version ($GRAD_VERSION, set by meson).
#
#   help.sh PROGRAM [COMMAND...] -- OPTION...
set -u
prog=$1
shift
cmd=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  cmd+=("$1")
  shift
done
[ $# -gt 0 ] && shift
name="$(basename "$prog")${cmd[*]:+ ${cmd[*]}}"
fail=0
help=$("$prog" "${cmd[@]}" --help 2>&1)
status=$?
if [ $status -ne 0 ]; then
  echo "FAIL: $name --help exited $status"
  fail=1
fi
for opt in --help "$@"; do
  # The option's own name, not a prefix of a longer one (--seq in --max-seq).
  if ! grep -Eq -- "(^|[ ,])$opt([ =,]|\$)" <<<"$help"; then
    echo "FAIL: $name --help does not list $opt"
    fail=1
  fi
done
version=$("$prog" --version 2>&1)
status=$?
if [ $status -ne 0 ] || [ "$version" != "grad ${GRAD_VERSION:-}" ]; then
  echo "FAIL: $(basename "$prog") --version exited $status and printed '$version' (expected 'grad ${GRAD_VERSION:-}')"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok: $name --help lists $# options; --version says $version"
exit $fail
