#!/usr/bin/env bash
# The runtime's folders are layers (README, "Layout"): a file in vm/X may
# include headers of the layers below X only, so dependencies point one way
# and no two folders include each other; and each folder's objects call
# only functions of its own layer or below (read with nm); and the stdlib's
# modules require one another without a circle. ops/ knows nothing of vm/,
# and nothing below the bindings knows Lua.
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
# the same order by symbols: what each folder's objects call (nm -u) is
# defined in its own folder or a layer below, never above (a function
# declared in a low header but defined higher up is a call upward that the
# includes do not show); ops/ calls nothing of vm/
objs="${CK_BUILD:-build}/CMakeFiles/ck_objs.dir"
if [ -d "$objs/vm" ] && command -v nm > /dev/null; then
  bad=$(
    for dir in "$objs"/vm/*/; do
      d=$(basename "$dir")
      find "$dir" -name '*.o' -exec nm --defined-only -g {} + 2> /dev/null | awk -v d="$d" 'NF == 3 && $2 ~ /[TDBRC]/ {print "D", $3, d}'
    done
    for dir in "$objs"/vm/*/ "$objs"/ops/; do
      d=$(basename "$dir")
      find "$dir" -name '*.o' -exec nm -u {} + 2> /dev/null | awk -v d="$d" 'NF >= 2 {print "U", $NF, d}'
    done | sort -u
  ) 
  order="${layers[*]}"
  while read -r line; do echo "FAIL $line"; fail=1; done < <(printf '%s\n' "$bad" | awk -v order="$order" '
    BEGIN { n = split(order, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
    $1 == "D" { def[$2] = $3; next }
    $1 == "U" { use[++m] = $2; by[m] = $3 }
    END {
      for (k = 1; k <= m; k++) {
        s = use[k]; d = by[k]; t = def[s]
        if (t == "" || t == d) continue
        if (d == "ops") print "ops/ calls " s ", defined in vm/" t
        else if (rank[t] <= rank[d]) print "vm/" d " calls " s ", defined in vm/" t " (not below " d ")"
      }
    }')
  # inside a folder too, the files' calls go one way: no file calls a file
  # that calls it back, directly or round a circle (nm of each object: what
  # it calls that another file of its folder defines), as Lua's lvm.c and
  # ldo.c sit above lobject.c and not beside it in a loop
  for dir in "$objs"/vm/*/; do
    d=$(basename "$dir")
    calls=$(mktemp)
    for o in "$dir"*.o; do
      f=$(basename "$o" .o)
      nm --defined-only -g "$o" 2> /dev/null | awk -v f="$f" 'NF == 3 && $2 ~ /[TDBRC]/ {print "D", $3, f}'
      nm -u "$o" 2> /dev/null | awk -v f="$f" 'NF >= 2 {print "U", $NF, f}'
    done | awk '$1 == "D" {def[$2] = $3; next} {use[++m] = $2; by[m] = $3}
                END {for (k = 1; k <= m; k++) {t = def[use[k]]; if (t != "" && t != by[k]) print by[k], t}}' |
      sort -u > "$calls"
    if ! loop=$(tsort "$calls" 2>&1 > /dev/null); then
      echo "FAIL the files of vm/$d call one another in a circle:"; printf '%s\n' "$loop" | grep -v 'input contains a loop'
      fail=1
    fi
    rm -f "$calls"
  done
else
  echo "FAIL no objects under $objs to read symbols from (CK_BUILD: the build folder)"; fail=1
fi
# the stdlib's modules require one another without a circle (a lazy
# require inside a function counts: it is a dependency all the same)
deps=$(mktemp)
for f in stdlib/ck/*.lua stdlib/ck/*/*.lua; do
  m=${f#stdlib/}; m=${m%.lua}; m=${m//\//.}
  grep -v '^ *--' "$f" | grep -o 'require *(\?"ck\.[a-z_.0-9]*"' | sed 's/.*"\(.*\)"/\1/' | sort -u |
    while read -r d; do [ "$d" != "$m" ] && echo "$m $d"; done
done > "$deps"
if ! loops=$(tsort "$deps" 2>&1 > /dev/null); then
  echo "FAIL the stdlib's modules require one another in a circle:"; printf '%s\n' "$loops"; fail=1
fi
rm -f "$deps"
if [ "$fail" = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$fail"
