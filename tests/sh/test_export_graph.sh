#!/usr/bin/env bash
# ckrun --plan --export-graph FILE: the CLI writes the compiled graph and each
# compared policy's decisions (the schema is tests/lua/test_graph_export.lua's
# subject; this checks the command line's door to it).
set -u
cd "$(dirname "$0")/../.."
CKRUN=${CKRUN:-build/ckrun}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass + 1)); echo "ok   $2"; else fail=$((fail + 1)); echo "FAIL $2"; fi; }

"$CKRUN" --plan --export-graph "$tmp/g.json" --policies none,diffusers scripts/train_sdxl_lora.lua >"$tmp/out" 2>&1
ok $? "ckrun --plan --export-graph runs"
"$CKRUN" --allow-read "$tmp" -e '
  local ck = require "ck"
  local f = assert(io.open(arg and arg[1] or "'"$tmp"'/g.json"))
  local d = ck.json_decode(f:read("a")); f:close()
  assert(d.schema == "ckrun.graph/1", "schema")
  assert(#d.ops > 0 and #d.tensors > 0, "ops and tensors")
  assert(#d.policies == 2 and d.policies[1].name == "none" and d.policies[2].name == "diffusers", "the policies compared")
  assert(#d.policies[1].recomputed == 0 and #d.policies[2].recomputed > 0, "none recomputes nothing, diffusers something")
  assert(d.policies[2].peak_bytes < d.policies[1].peak_bytes, "diffusers plans less than none")
' >"$tmp/check" 2>&1
ok $? "the file holds the graph and both policies' decisions $(tr '\n' ' ' <"$tmp/check")"
echo "not a folder" >"$tmp/file"
"$CKRUN" --plan --export-graph "$tmp/file/g.json" scripts/train_sdxl_lora.lua >"$tmp/out2" 2>&1
rc=$?
[ "$rc" != 0 ] && [ "$(cat "$tmp/file")" = "not a folder" ]
ok $? "an export path that cannot be written fails (exit $rc): $(tail -1 "$tmp/out2")"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
