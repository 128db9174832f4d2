# Each script's options are declared once (ck.options): `ckrun SCRIPT --help`
# lists every option with its description and default and runs nothing, and
# README.md's section for the script names every option of the table and no
# option the table lacks. ckrun's own option list in ck.options (the hint for
# one given after the script) equals the one `ckrun --help` prints.
set -u
CKRUN=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
SRC=$PWD
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# the long options `ckrun --help` lists, and those ck.options knows (plus --help,
# which after the script is the script's own)
"$CKRUN" --help | sed -n 's/^ *\(-[a-z], \)\{0,1\}--\([a-z][a-z-]*\).*/\2/p' | sort -u > "$dir/ckrun"
"$CKRUN" -e 'for _, n in ipairs(require("ck.options").CKRUN_OPTIONS) do print(n) end print("help")' | sort -u > "$dir/known"
[ -s "$dir/ckrun" ] && diff "$dir/ckrun" "$dir/known" > "$dir/d"; ok $? "ck.options.CKRUN_OPTIONS is ckrun --help's list ($(tr '\n' ' ' < "$dir/d"))"

# section_check README HEADING TABLE: the README section under HEADING names
# every option in the file TABLE and no other (ckrun's own options aside)
section_check() {
  python3 - "$1" "$2" "$3" "$dir/ckrun" <<'PY'
import re, sys
readme, heading, table, ckrun = sys.argv[1:]
lines = open(readme).read().split("\n")
start = [i for i, l in enumerate(lines) if re.match(r"#+ ", l) and l.split(" ", 1)[1] == heading]
assert len(start) == 1, "no single README heading '%s'" % heading
end = next((i for i in range(start[0] + 1, len(lines)) if re.match(r"#+ ", lines[i])), len(lines))
text = "\n".join(lines[start[0]:end])
table = set(open(table).read().split())
ckrun = set(open(ckrun).read().split())
named = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9_-]*)", text))
# kohya's and diffusers' own flags are spelt with underscores (--fp8_base), and
# the README shows one misspelling on purpose (--max-grad-nrom)
named = {n for n in named if "_" not in n} - {"max-grad-nrom"}
missing = sorted(table - named)
extra = sorted(named - table - ckrun)
if missing: print("options of the table the README section does not name:", " ".join("--" + n for n in missing))
if extra: print("options the README section names that the table lacks:", " ".join("--" + n for n in extra))
sys.exit(1 if missing or extra else 0)
PY
}

check() { # script, README heading (empty: the script is not in the README)
  local script=$1 heading=$2 name
  name=$(basename "$script" .lua)
  mkdir "$dir/run"
  (cd "$dir/run" && "$CKRUN" "$SRC/$script" --help) > "$dir/$name.help" 2>&1; rc=$?
  [ $rc = 0 ] && [ -z "$(ls -A "$dir/run")" ] && grep -q "^usage: ckrun" "$dir/$name.help"
  ok $? "$script --help exits 0, prints the usage and writes nothing"
  rm -rf "$dir/run"
  sed -n 's/^  --\([a-z0-9][a-z0-9-]*\).*/\1/p' "$dir/$name.help" | grep -vx help | sort -u > "$dir/$name.table"
  [ "$(wc -l < "$dir/$name.table")" -ge 2 ]; ok $? "$script --help lists its options ($(wc -l < "$dir/$name.table"))"
  [ -z "$heading" ] && return
  section_check README.md "$heading" "$dir/$name.table"
  ok $? "README's '$heading' names exactly $script's options"
}
check scripts/train_sdxl_lora.lua "Training an SDXL LoRA"
check scripts/policy_sweep.lua "Policy experiments"
check scripts/make_synthetic_data.lua "A dataset on disk"
check scripts/make_shapes_dataset.lua "A folder of images"
check scripts/generate.lua "Generating images"
check scripts/train_flux_lora.lua "Training a Flux LoRA"
for s in bench/gpu_step.lua bench/logging.lua bench/state_save.lua bench/vs_pytorch.lua; do check $s ""; done

# the comparison can fail both ways: an option the section lacks, one the table lacks
{ cat "$dir/policy_sweep.table"; echo no-such-option; } > "$dir/more.table"
out=$(section_check README.md "Policy experiments" "$dir/more.table"); rc=$?
[ $rc != 0 ] && printf '%s' "$out" | grep -q "does not name: --no-such-option"; ok $? "an option missing from the README is found ($out)"
sed 1d "$dir/policy_sweep.table" > "$dir/less.table"
out=$(section_check README.md "Policy experiments" "$dir/less.table"); rc=$?
[ $rc != 0 ] && printf '%s' "$out" | grep -q "that the table lacks: --$(head -1 "$dir/policy_sweep.table")"
ok $? "an option the table lacks is found ($out)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
