# kohya's spellings of scripts/train_sdxl_lora.lua's options (sd-scripts'
# train_network.py and sdxl_train_network.py): a command line in kohya's names
# trains the adapter the same line in ckrun's names trains, bitwise (metadata
# included); kohya's flags for choices (--v_parameterization,
# --gradient_checkpointing, --optimizer_type) are those choices; an option
# given under both names is refused, naming both.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
A="--allow-write $dir --allow-read $dir"
S=scripts/train_sdxl_lora.lua

"$CKRUN" $A $S --resolution 64 --samples 4 --steps 2 --lr 0.01 --rank 2 --alpha 1 --batch 2 --max-grad-norm 0.5 \
  --mixed-precision bf16 --seed 3 --noise-offset 0.05 --lr-scheduler cosine --lr-warmup-steps 1 --save-precision fp16 \
  --optimizer lion --prediction v --checkpoint diffusers --save-lora-every 1 \
  --out "$dir/ck.safetensors" --log-dir "$dir/l1" > "$dir/ck.out" 2>&1 ; rc=$?
ok $rc "the run in ckrun's names trains ($(tail -1 "$dir/ck.out"))"
"$CKRUN" $A $S --resolution 64,64 --samples 4 --steps 2 --learning_rate 0.01 --network_dim 2 --network_alpha 1 \
  --train_batch_size 2 --max_grad_norm 0.5 --mixed_precision bf16 --seed 3 --noise_offset 0.05 --lr_scheduler cosine \
  --lr_warmup_steps 1 --save_precision fp16 --optimizer_type Lion --v_parameterization --gradient_checkpointing \
  --save_every_n_steps 1 --out "$dir/kohya.safetensors" --log-dir "$dir/l2" > "$dir/kohya.out" 2>&1 ; rc=$?
ok $rc "the run in kohya's names trains ($(tail -1 "$dir/kohya.out"))"
cmp -s "$dir/ck.safetensors" "$dir/kohya.safetensors" && cmp -s "$dir/ck-step00000001.safetensors" "$dir/kohya-step00000001.safetensors"
ok $? "both write the same adapter bitwise, and the same snapshot at step 1 (--save_every_n_steps)"
g=$("$CKRUN" $A -e "local f = require('ck').safetensors('$dir/kohya.safetensors') local m = f:metadata()
io.write(m.ss_gradient_checkpointing, ' ', m.ss_optimizer, ' ', m.ss_network_dim, ' ', m.ss_mixed_precision)")
[ "$g" = "True lion_pytorch.lion_pytorch.Lion 2 bf16" ] ; ok $? "its metadata says what kohya's names asked for ($g)"

err=$("$CKRUN" $A $S --resolution 64 --lr 0.01 --learning_rate 0.02 --out "$dir/x.safetensors" 2>&1)
printf '%s' "$err" | grep -q "^ckrun: $S:[0-9]*: --learning_rate and --lr are given, which name one option (--lr): give one$"
ok $? "--lr and --learning_rate together are refused ($err)"
err=$("$CKRUN" $A $S --resolution 512,768 --out "$dir/x.safetensors" 2>&1)
printf '%s' "$err" | grep -q "^ckrun: $S:[0-9]*: --resolution takes a square: kohya's W,H 512,768 is not one (other aspect ratios come from --enable-bucket)$"
ok $? "kohya's --resolution W,H of another shape is refused in one line ($err)"
err=$("$CKRUN" $A $S --output_dir "$dir" --output_name x 2>&1)
printf '%s' "$err" | grep -q "^ckrun: $S:[0-9]*: --output_dir is kohya's option: ckrun writes one file: --out OUTPUT_DIR/OUTPUT_NAME.safetensors; --output_name is kohya's option: "
ok $? "kohya's --output_dir and --output_name point to --out, each in its line's part ($err)"
[ ! -e "$dir/x.safetensors" ] ; ok $? "no refused run wrote its file"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
