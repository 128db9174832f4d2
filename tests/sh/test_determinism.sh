# Two runs of a small training script give bitwise identical losses and
# parameters (hex floats compared byte for byte), at the same thread count.
set -u
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$CKRUN" tests/scripts/train_small.lua --steps 5 > "$out/a" || { echo "FAIL first run"; exit 1; }
"$CKRUN" tests/scripts/train_small.lua --steps 5 > "$out/b" || { echo "FAIL second run"; exit 1; }
pass=0 fail=0
if [ "$(grep -c '^loss' "$out/a")" = 5 ] && [ "$(wc -l < "$out/a")" -gt 10 ]; then pass=$((pass+1)); echo "ok   the run printed 5 losses and the parameters"; else fail=$((fail+1)); echo "FAIL output incomplete"; fi
if cmp -s "$out/a" "$out/b"; then pass=$((pass+1)); echo "ok   losses and parameters are bitwise identical"; else fail=$((fail+1)); echo "FAIL runs differ:"; diff "$out/a" "$out/b" | head -5; fi
# the losses change from step to step: the comparison is not of constants
if [ "$(grep '^loss' "$out/a" | awk '{print $3}' | sort -u | wc -l)" = 5 ]; then pass=$((pass+1)); echo "ok   the loss moves every step"; else fail=$((fail+1)); echo "FAIL the loss did not move"; fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
