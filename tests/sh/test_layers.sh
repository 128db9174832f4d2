#!/usr/bin/env bash
# The runtime's folders are layers (README, "Layout"): a file in vm/X may
# include headers of the layers below X only, so dependencies point one way
# and no two folders include each other. ops/ knows nothing of vm/, and
# nothing below the bindings knows Lua.
set -u
cd "$(dirname "$0")/../.."
# top to bottom; vm/ck.h (the public header, a leaf) may be included anywhere
layers=(cli embed lua guard formats run dist plan graph text util)
fail=0
rank() { local i; for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }

for dir in vm/*/; do
  d=$(basename "$dir")
  rd=$(rank "$d")
  if [ "$rd" -lt 0 ]; then echo "FAIL vm/$d is not a layer of this test's list"; fail=1; continue; fi
  for f in "$dir"*.[ch]; do
    while IFS= read -r inc; do
      case "$inc" in
        ck.h|../../ops/*) continue ;;
        */*) ;;
        *) echo "FAIL $f includes \"$inc\": vm headers are named by their folder"; fail=1; continue ;;
      esac
      t=${inc%%/*}
      [ "$t" = "$d" ] && continue
      rt=$(rank "$t")
      if [ "$rt" -lt 0 ]; then echo "FAIL $f includes \"$inc\", outside the layers"; fail=1
      elif [ "$rt" -le "$rd" ]; then echo "FAIL $f ($d) includes \"$inc\" ($t is not below $d)"; fail=1; fi
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
  done
done
# nothing below the Lua bindings knows Lua, save the guard and util layers
# (limits, the sandbox and the script's file:line are about a lua_State)
for d in formats run plan graph text; do
  if grep -ln '#include <l\(ua\|auxlib\|ualib\)\.h>' vm/$d/*.[ch] 2>/dev/null; then
    echo "FAIL vm/$d includes a Lua header"; fail=1
  fi
done
if grep -rln '#include ".*vm/' ops 2>/dev/null; then echo "FAIL ops/ includes vm/"; fail=1; fi
if grep -rln '#include <l\(ua\|auxlib\|ualib\)\.h>' ops 2>/dev/null; then echo "FAIL ops/ includes a Lua header"; fail=1; fi
# no cycle among the headers of one folder either: each header's includes,
# followed transitively, never come back to it
for h in vm/*/*.h; do
  seen=" "; todo="${h#vm/}"
  while [ -n "$todo" ]; do
    cur=${todo%% *}; [ "$todo" = "$cur" ] && todo="" || todo=${todo#* }
    for inc in $(sed -n 's/^#include "\([a-z]*\/[^"]*\)".*/\1/p' "vm/$cur" 2>/dev/null); do
      if [ "$inc" = "${h#vm/}" ]; then echo "FAIL $h includes itself through $cur"; fail=1; fi
      case "$seen" in *" $inc "*) ;; *) seen="$seen$inc "; todo="${todo:+$todo }$inc" ;; esac
    done
  done
done
if [ "$fail" = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$fail"
