#!/usr/bin/env bash
# The libraries export their API and nothing else: libck.so exactly the
# functions vm/ck.h declares CK_API, ck.so exactly luaopen_ck (the objects are
# built with -fvisibility=hidden; cmake/libck.map and cmake/ck_module.map).
set -u
cd "$(dirname "$0")/../.."
B=${CK_BUILD:-build}
fail=0
ok() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fail=1; fi; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# CK_API ... name(  in the header, one declaration a line
sed -n 's/^CK_API [^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' vm/ck.h | sort -u > "$T/api"
[ "$(wc -l < "$T/api")" -ge 20 ]; ok $? "vm/ck.h declares the API with CK_API ($(wc -l < "$T/api") functions)"

exports() { nm -D --defined-only "$1" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u; }

if [ -f "$B/libck.so" ]; then
  exports "$B/libck.so" > "$T/libck"
  extra=$(comm -13 "$T/api" "$T/libck" | tr '\n' ' ')
  missing=$(comm -23 "$T/api" "$T/libck" | tr '\n' ' ')
  [ -z "$extra" ]; ok $? "libck.so exports nothing vm/ck.h does not declare${extra:+ (it exports: $extra)}"
  [ -z "$missing" ]; ok $? "libck.so exports every CK_API function${missing:+ (missing: $missing)}"
else
  ok 1 "$B/libck.so is built"
fi
if [ -f "$B/lua/ck.so" ]; then
  got=$(exports "$B/lua/ck.so" | tr '\n' ' ')
  [ "$got" = "luaopen_ck " ]; ok $? "ck.so exports luaopen_ck alone (it exports: $got)"
else
  ok 1 "$B/lua/ck.so is built"
fi
if [ "$fail" = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$fail"
