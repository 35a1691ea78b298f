#!/usr/bin/env bash
# gdb pretty-printer test: stops eager_debug at its "BREAK HERE" line under `gdb -batch`, prints
# Arrays and checks the text. Runs twice: with the printer auto-loaded from libcjax.so's
# .debug_gdb_scripts section, and with it sourced from tools/gdb/cjax_printers.py (twice, to check
# that loading it again is harmless). Exits 77 (ctest: skipped) when gdb is missing or cannot
# trace processes here.
#
# Both of the printer's paths are covered on every host: "auto-load" lets it call into the program
# (asserted to have made calls where this gdb can call functions, reported where it cannot), the
# other modes force the memory reader (asserted to have made no call). A second program
# (gdb_lifetimes) holds Arrays that are unconstructed, destroyed, and one whose printing call
# faults: each prints a placeholder, the program survives and gdb reports the fault once.
# usage: run_gdb_test.sh <eager_debug executable> <eager_debug.cpp> <cjax_printers.py> <libcjax dir>
#                        <gdb_lifetimes executable> <gdb_lifetimes.cpp>
set -u
exe=$1 src=$2 printer=$3 libdir=$4 lifetimes_exe=$5 lifetimes_src=$6
# Under ASan, LeakSanitizer cannot run in a traced process (it exits with 1 at the end).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

if ! command -v gdb >/dev/null 2>&1; then
  echo "SKIP: gdb is not installed"
  exit 77
fi
if ! gdb -nx -batch -iex 'set debuginfod enabled off' -ex 'python print("py-ok")' 2>&1 | grep -q py-ok; then
  echo "SKIP: this gdb has no Python support"
  exit 77
fi
line=$(grep -n '// BREAK HERE' "$src" | head -n 1 | cut -d: -f1)
if [ -z "$line" ]; then
  echo "FAIL: no 'BREAK HERE' marker in $src"
  exit 1
fi

run_gdb() {  # extra gdb options...
  gdb -nx -batch -iex 'set debuginfod enabled off' "$@" \
    -ex "break eager_debug.cpp:$line" -ex run \
    -ex 'print x' -ex 'print y' -ex next -ex 'print y' \
    -ex 'print w' -ex 'print mask' -ex 'print n' -ex 'next 4' -ex 'print s' -ex 'print e' \
    -ex 'print &x' -ex 'print *&x' -ex 'print big' -ex 'info pretty-printer' \
    -ex 'python print("cjax-calls-made=%d failed=%d" % (_calls_made, len(_calls_failed)))' \
    -ex kill "$exe" 2>&1
}

# Whether this gdb can call functions in the debugged program here (gdb 13 cannot on CPUs with
# AMX, and some sandboxes forbid it).
can_call=no
probe=$(gdb -nx -batch -iex 'set debuginfod enabled off' -iex 'set auto-load python-scripts off' \
          -ex "break eager_debug.cpp:$line" -ex run -ex 'print (int)cjax_debug_string(0)[0]' -ex kill "$exe" 2>&1)
grep -qE '^\$1 = 60$' <<<"$probe" && can_call=yes  # '<' of "<null>"
echo "gdb can call functions in the program here: $can_call"

status=0
check() {  # mode output expected-substring...
  local mode=$1 out=$2
  shift 2
  for want in "$@"; do
    if ! grep -qF -- "$want" <<<"$out"; then
      echo "FAIL ($mode): expected to find: $want"
      status=1
    fi
  done
}

# auto-load: the copy embedded in libcjax.so, default settings (call into the inferior; where
#   gdb cannot, read memory and format with numpy).
# source: the file sourced twice, inferior calls off (always reads memory).
# plain: as source, with numpy hidden from gdb's Python (built-in formatter).
for mode in auto-load source plain; do
  case $mode in
    auto-load) out=$(run_gdb -iex "add-auto-load-safe-path $libdir") ;;
    source) out=$(run_gdb -iex 'set auto-load python-scripts off' -ex "source $printer" -ex "source $printer" \
                          -ex 'set cjax-inferior-calls off') ;;
    plain) out=$(run_gdb -iex 'set auto-load python-scripts off' -ex "source $printer" \
                         -ex 'set cjax-inferior-calls off' -ex 'python import sys; sys.modules["numpy"] = None') ;;
  esac
  echo "---- gdb output ($mode) ----"
  echo "$out"
  if grep -qE 'ptrace: Operation not permitted|Could not trace the inferior|not permitted to trace' <<<"$out"; then
    echo "SKIP: gdb may not trace processes on this machine"
    exit 77
  fi
  if [ "$mode" = plain ]; then
    check "$mode" "$out" \
      '$1 = f32[2,3] [[1. 2. 3.] [4. 5. 6.]]' \
      '$3 = f32[2,3] [[2. 4. 6.] [8. 10. 12.]]' \
      '$4 = f32[3] [0.5 -1. 2.]' \
      '$5 = bool[3] [True False True]' \
      '$6 = i32[3] [1 2 3]' \
      '$7 = f32[] 0.5' \
      '$8 = f32[2,3] [[0.36787945 0.13533528 0.04978' \
      '$11 = i32[2000] [0 1 2 ... 1997 1998 1999]'
    continue
  fi
  check "$mode" "$out" \
    '$11 = i32[2000] [   0    1    2 ... 1997 1998 1999]' \
    '$1 = f32[2,3] [[1. 2. 3.] [4. 5. 6.]]' \
    '$3 = f32[2,3] [[ 2.  4.  6.] [ 8. 10. 12.]]' \
    '$4 = f32[3] [ 0.5 -1.   2. ]' \
    '$5 = bool[3] [ True False  True]' \
    '$6 = i32[3] [1 2 3]' \
    '$7 = f32[] 0.5' \
    '$8 = f32[2,3] [[0.367879' \
    '= f32[2,3] [[1. 2. 3.] [4. 5. 6.]]'
  # `print y` before its constructor ran must not crash the program (it may show anything).
  check "$mode" "$out" '$2 = '
  if [ "$mode" = auto-load ]; then
    if [ "$can_call" = yes ] && ! grep -qE 'cjax-calls-made=[1-9][0-9]* failed=0$' <<<"$out"; then
      echo "FAIL ($mode): gdb can call functions here, but the printer made no successful call"
      status=1
    fi
  elif ! grep -q 'cjax-calls-made=0 failed=0$' <<<"$out"; then
    echo "FAIL ($mode): the printer called into the program (it must only read memory here)"
    status=1
  fi
  if grep -qE 'signaled while in a function called from GDB|Segmentation fault' <<<"$out"; then
    echo "FAIL ($mode): printing crashed the inferior"
    status=1
  fi
done
# ---- unconstructed, destroyed, and a faulting call ----
lline=$(grep -n '// BREAK HERE' "$lifetimes_src" | head -n 1 | cut -d: -f1)
run_lifetimes() {  # extra gdb options...
  gdb -nx -batch -iex 'set debuginfod enabled off' -iex 'set auto-load python-scripts off' -ex "source $printer" "$@" \
    -ex "break gdb_lifetimes.cpp:$lline" -ex run \
    -ex 'print *unconstructed' -ex 'print *destroyed' -ex 'print live' \
    -ex 'python _DEBUG_STRING_FN = "cjax_test_faulting_debug_string"' \
    -ex 'print live' -ex 'print live' -ex 'python print("cjax-calls-made=%d" % _calls_made)' \
    -ex continue "$lifetimes_exe" 2>&1
}
for mode in lifetimes-calls lifetimes-memory; do
  case $mode in
    lifetimes-calls) out=$(run_lifetimes) ;;
    lifetimes-memory) out=$(run_lifetimes -ex 'set cjax-inferior-calls off') ;;
  esac
  echo "---- gdb output ($mode) ----"
  echo "$out"
  check "$mode" "$out" \
    '$1 = cjax::Array <uninitialized or destroyed: impl=0xa5a5a5a5a5a5a5a5>' \
    '$2 = cjax::Array <uninitialized or destroyed' \
    '$3 = f32[3] [1. 2. 3.]' \
    '$5 = f32[3] [1. 2. 3.]' \
    'exited normally'
  # $4: where the call faults, gdb's fault report comes between "$4 = " and the value.
  if ! grep -qF '$4 = f32[3] [1. 2. 3.]' <<<"$out" && ! grep -qxF 'f32[3] [1. 2. 3.]' <<<"$out"; then
    echo "FAIL ($mode): \$4 did not print the value"
    status=1
  fi
  faults=$(grep -c 'received signal SIGSEGV' <<<"$out")
  if grep -qE 'RecursionError|Python Exception' <<<"$out"; then
    echo "FAIL ($mode): the printer raised or recursed"
    status=1
  fi
  if [ "$mode" = lifetimes-calls ] && [ "$can_call" = yes ]; then
    # The first call (print live, $3) works; the substituted one faults once, gdb restores the
    # program, the printer reads memory from then on and makes no further call.
    check "$mode" "$out" 'cjax-calls-made=2' 'cjax::Array <not printed: the cjax printer is busy'
    if [ "$faults" != 1 ]; then
      echo "FAIL ($mode): expected gdb to report exactly one fault, got $faults"
      status=1
    fi
  elif [ "$mode" = lifetimes-memory ]; then
    check "$mode" "$out" 'cjax-calls-made=0'
    if [ "$faults" != 0 ]; then
      echo "FAIL ($mode): a call faulted although the printer must not call"
      status=1
    fi
  fi
done

[ "$status" = 0 ] && echo "PASS: gdb pretty-printer"
exit $status
