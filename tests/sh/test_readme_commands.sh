# Every build/ckrun command in README.md's ```sh blocks runs and exits 0, in a
# scratch working directory (build/ and scripts/ linked there), as written or
# with the change the table below names and says why. A command that needs
# what a test machine lacks (a dataset, SDXL weights, a GPU) runs with
# --plan, which reads no data or weights; long runs get a smaller documented
# --steps or --resolution. A README command the table names but the README
# no longer has fails the test, so the table follows the README.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
SRC=$PWD
BUILD=$(cd "${CK_BUILD:-build}" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
D=$SRC/tests/data P=$SRC/tests/data/flow/pipeline # tiny stand-ins for the README's model files

# the commands: ```sh blocks' lines starting build/ckrun, continuations joined, comments cut
python3 - README.md > "$dir/commands" <<'PY'
import re, sys
block, cmd = False, None
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if line.startswith("```"):
        block = line.strip() == "```sh"
        continue
    if not block:
        continue
    if cmd is not None:
        cmd += " " + line.strip()
    elif line.startswith("build/ckrun"):
        cmd = line
    else:
        continue
    if cmd.endswith("\\"):
        cmd = cmd[:-1].rstrip()
        continue
    cmd = re.sub(r"\s+#.*$", "", cmd)
    print(re.sub(r"\s+", " ", cmd).strip())
    cmd = None
PY
n=$(wc -l < "$dir/commands")
[ "$n" -ge 15 ]; ok $? "README.md shows $n build/ckrun commands"

# how a command runs when not as written: "skip: why" or "run: the command; why"
how() {
  case "$1" in
  "build/ckrun SCRIPT.lua [--key value ...]")
    echo "skip: the syntax, not a command (tests/sh/test_cli.sh runs arguments through)" ;;
  "build/ckrun scripts/train_sdxl_lora.lua --size full --data DIR --weights unet.safetensors --full --optimizer adamw8bit --fused-backward --checkpoint diffusers")
    echo "run: build/ckrun --plan ${1#build/ckrun }; no dataset or SDXL weights here: planned, not run" ;;
  "build/ckrun scripts/train_sdxl_lora.lua --size full --data DIR --weights unet.safetensors --resolution 1024 --batch 1 --steps 2000 --lr 1e-4 --rank 16 --alpha 16 --checkpoint budget:62% --save-every 200 --out out/my_lora.safetensors")
    echo "run: build/ckrun --plan ${1#build/ckrun }; no dataset or SDXL weights here: planned, not run" ;;
  "build/ckrun scripts/train_sdxl_lora.lua --resume")
    echo "run: build/ckrun scripts/train_sdxl_lora.lua --steps 3 --save-every 2 > /dev/null && $1 --steps 3; a state to resume from first, 3 steps instead of 300" ;;
  "build/ckrun --allow-write out/shapes scripts/train_sdxl_lora.lua --data out/shapes --resolution 128 --enable-bucket --min-bucket-reso 64 --max-bucket-reso 256 --steps 40 --out out/shapes_lora.safetensors")
    echo "run: build/ckrun scripts/make_shapes_dataset.lua out/shapes > /dev/null && $1; the set the line above makes, made first" ;;
  "build/ckrun scripts/policy_sweep.lua")
    echo "run: $1 --resolution 256 --steps 2; shorter (tests/sh/test_policy_sweep.sh runs it with every default)" ;;
  "build/ckrun scripts/policy_sweep.lua --resolution 256 --batch 2 --budgets 80%,62% --svg out/sweep.svg")
    echo "run: $1 --steps 2; one timed step instead of two" ;;
  "build/ckrun scripts/train_flux_lora.lua --pretrained-model-name-or-path flux1-dev.safetensors --ae ae.safetensors --clip-l clip_l.safetensors --t5xxl t5xxl_fp16.safetensors --tokenizer clip_tokenizer --t5-tokenizer spiece.model --data DIR --enable-bucket --mixed-precision bf16 --fp8-base --gradient_checkpointing --rank 16 --lr 1e-4 --timestep-sampling shift --discrete-flow-shift 3.1582 --model-prediction-type raw --guidance-scale 1.0 --steps 2000 --out out/flux_lora.safetensors")
    echo "run: build/ckrun scripts/make_shapes_dataset.lua DIR > /dev/null && build/ckrun --allow-read $D scripts/train_flux_lora.lua --pretrained-model-name-or-path $D/flux/bfl.safetensors --size tiny --ae $D/flux/vae --clip-l $P/text_encoder --t5xxl $P/text_encoder_2 --tokenizer $P/tokenizer --t5-tokenizer $P/tokenizer_2 --data DIR --enable-bucket --mixed-precision bf16 --fp8-base --gradient_checkpointing --rank 16 --lr 1e-4 --timestep-sampling shift --discrete-flow-shift 3.1582 --model-prediction-type raw --guidance-scale 1.0 --resolution 64 --steps 2 --out out/flux_lora.safetensors; FLUX.1-dev's files replaced by tests/data's flux-tiny single file and tiny Flux folder, 64 pixels and 2 steps" ;;
  "build/ckrun scripts/train_flux_lora.lua --pretrained-model-name-or-path FLUX.1-dev --data DIR --sample-every 250 --sample-prompts prompts.txt --out out/flux_lora.safetensors")
    echo "run: build/ckrun scripts/make_shapes_dataset.lua DIR > /dev/null && echo 'a red circle --w 64 --h 64 --s 2' > prompts.txt && build/ckrun --allow-read $D scripts/train_flux_lora.lua --pretrained-model-name-or-path $P --data DIR --sample-every 2 --sample-prompts prompts.txt --resolution 64 --steps 2 --out out/flux_lora.safetensors; tests/data's tiny Flux folder for FLUX.1-dev, 64 pixels, 2 steps and a sample at the second" ;;
  esac
}
# the table's commands, which the README must still show
TABLE="build/ckrun SCRIPT.lua [--key value ...]
build/ckrun scripts/train_sdxl_lora.lua --size full --data DIR --weights unet.safetensors --full --optimizer adamw8bit --fused-backward --checkpoint diffusers
build/ckrun scripts/train_sdxl_lora.lua --size full --data DIR --weights unet.safetensors --resolution 1024 --batch 1 --steps 2000 --lr 1e-4 --rank 16 --alpha 16 --checkpoint budget:62% --save-every 200 --out out/my_lora.safetensors
build/ckrun scripts/train_sdxl_lora.lua --resume
build/ckrun scripts/policy_sweep.lua
build/ckrun scripts/policy_sweep.lua --resolution 256 --batch 2 --budgets 80%,62% --svg out/sweep.svg
build/ckrun --allow-write out/shapes scripts/train_sdxl_lora.lua --data out/shapes --resolution 128 --enable-bucket --min-bucket-reso 64 --max-bucket-reso 256 --steps 40 --out out/shapes_lora.safetensors
build/ckrun scripts/train_flux_lora.lua --pretrained-model-name-or-path flux1-dev.safetensors --ae ae.safetensors --clip-l clip_l.safetensors --t5xxl t5xxl_fp16.safetensors --tokenizer clip_tokenizer --t5-tokenizer spiece.model --data DIR --enable-bucket --mixed-precision bf16 --fp8-base --gradient_checkpointing --rank 16 --lr 1e-4 --timestep-sampling shift --discrete-flow-shift 3.1582 --model-prediction-type raw --guidance-scale 1.0 --steps 2000 --out out/flux_lora.safetensors
build/ckrun scripts/train_flux_lora.lua --pretrained-model-name-or-path FLUX.1-dev --data DIR --sample-every 250 --sample-prompts prompts.txt --out out/flux_lora.safetensors"
while IFS= read -r c; do
  grep -qxF -- "$c" "$dir/commands"; ok $? "the README still shows: $c"
done <<< "$TABLE"

i=0
while IFS= read -r cmd; do
  i=$((i+1))
  w="$dir/run$i"
  mkdir -p "$w"
  ln -s "$BUILD" "$w/build"
  ln -s "$SRC/scripts" "$w/scripts"
  h=$(how "$cmd")
  case "$h" in
  skip:*) echo "skip $cmd (${h#skip: })"; continue ;;
  run:*) run=${h#run: }; run=${run%%; *}; note=" (${h##*; })" ;;
  *) run=$cmd; note="" ;;
  esac
  (cd "$w" && OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} eval "$run") > "$dir/out$i" 2>&1; rc=$?
  [ $rc = 0 ]; ok $? "$cmd$note"
  [ $rc = 0 ] || tail -3 "$dir/out$i"
  rm -rf "$w"
done < "$dir/commands"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
