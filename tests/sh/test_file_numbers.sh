# The training script refuses numbers from files it cannot use as given, with
# one line naming the file and a non-zero exit, before training on them: a
# sample's timestep outside 0..999 or not whole (1e9, -5, 2.5, NaN), and a
# state whose counts are out of range (data.pos at 2^63-1 and past the set,
# data.epoch past the step, ck.updates at 2^63-1, ck.micro at -1); good
# timesteps train, and a state whose name and ck.step are 2^63-1 is passed
# over by --resume like any stray file.
set -u
dir=out/.test_file_numbers.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
R=tests/scripts/rewrite_sample.lua
S="scripts/train_sdxl_lora.lua --resolution 64 --samples 4 --batch 2 --log-every 10"

"$CKRUN" scripts/make_synthetic_data.lua "$dir/data" 4 --resolution 64 > /dev/null || exit 1
one_line() { [ "$(printf '%s\n' "$1" | grep -c '^ckrun: ')" = 1 ] && [ "$(printf '%s\n' "$1" | tail -n 1 | grep -c '^ckrun: ')" = 1 ]; }
# every sample carries a timestep (999, the last), so the samples' own are used
mkdir -p "$dir/good"
for f in "$dir"/data/*.safetensors; do "$CKRUN" $R "$f" "$dir/good/$(basename "$f")" tensor timesteps 999; done
out=$("$CKRUN" $S --data "$dir/good" --steps 2 --log-dir "$dir/log_good" --out "$dir/good.safetensors" 2>&1)
[ $? = 0 ] && [ -s "$dir/good.safetensors" ] ; ok $? "samples whose timesteps are 999 train: $(printf '%s\n' "$out" | grep 'training loss')"
# the Lua test (tests/lua/test_timesteps.lua) tries more values; these go through the script
for t in 1e9 -5 2.5 nan; do
  rm -rf "$dir/d" && cp -r "$dir/good" "$dir/d"
  "$CKRUN" $R "$dir/data/000003.safetensors" "$dir/d/000003.safetensors" tensor timesteps "$t"
  out=$("$CKRUN" $S --data "$dir/d" --steps 4 --log-dir "$dir/log" --out "$dir/x.safetensors" 2>&1)
  rc=$?
  [ "$rc" != 0 ] && [ ! -e "$dir/x.safetensors" ] && one_line "$out" &&
    printf '%s\n' "$out" | tail -n 1 | grep -qE "^ckrun: $dir/d/000003\.safetensors: timestep [^ ]+ is not a whole number from 0 to 999"
  ok $? "a sample's timestep $t is refused naming the file: $(printf '%s\n' "$out" | tail -n 1)"
done

# a state of 2 steps, then copies with one count out of range
"$CKRUN" $S --steps 4 --save-every 2 --state-dir "$dir/state" --log-dir "$dir/log_s" --out "$dir/s.safetensors" > /dev/null 2>&1
st="$dir/state/state-000000002.safetensors"
[ -s "$st" ] ; ok $? "a run of 4 steps saved its state at step 2"
# (tests/lua/test_state_numbers.lua tries more values of each key)
for c in data.pos:9223372036854775807 data.pos:5 data.epoch:3 ck.updates:9223372036854775807 ck.micro:-1; do
  key=${c%%:*} value=${c#*:}
  rm -rf "$dir/bad" && mkdir -p "$dir/bad"
  "$CKRUN" $R "$st" "$dir/bad/state-000000002.safetensors" meta "$key" "$value"
  out=$("$CKRUN" $S --steps 4 --resume "$dir/bad" --state-dir "$dir/bad" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1)
  rc=$?
  [ "$rc" != 0 ] && [ ! -e "$dir/b.safetensors" ] && one_line "$out" &&
    printf '%s\n' "$out" | tail -n 1 | grep -qF "$dir/bad/state-000000002.safetensors: $key is '$value', not a whole number from 0 to"
  ok $? "a state with $key = $value is refused naming the file and the key: $(printf '%s\n' "$out" | tail -n 1)"
done
rm -rf "$dir/bad" && mkdir -p "$dir/bad"
cp "$st" "$dir/bad/"
"$CKRUN" $R "$st" "$dir/bad/state-9223372036854775807.safetensors" meta ck.step 9223372036854775807
out=$("$CKRUN" $S --steps 4 --resume "$dir/bad" --state-dir "$dir/bad" --log-dir "$dir/log_c" --out "$dir/c.safetensors" 2>&1)
[ $? = 0 ] && printf '%s\n' "$out" | grep -q "resumed from $dir/bad/state-000000002.safetensors at step 2"
ok $? "a state named and stepped 2^63-1 is passed over: $(printf '%s\n' "$out" | grep resumed)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
