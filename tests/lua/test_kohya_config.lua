-- ck.kohya_config: kohya's --config-file gives option values by ckrun's
-- names (sections flattened, underscore spellings and kohya's own names
-- mapped, each value checked as the option checks it), and kohya's
-- --dataset-config gives subsets with kohya's defaults and inheritance
-- (subset, dataset, [general], the command line, defaults), each key checked
-- for its level, type and range; every refusal is one line naming the file
-- and line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local kc = require "ck.kohya_config"
local options = require "ck.options"
local T = require "check"

local tmp = string.format("out/test_kohya_config.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function write(name, s)
  local f = assert(io.open(tmp .. "/" .. name, "wb"))
  f:write(s)
  f:close()
  return tmp .. "/" .. name
end

local function raises(what, pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  local msg = tostring(err)
  T.ok(not ok and msg:find(pattern) ~= nil and not msg:find("\n"), what .. " (" .. msg .. ")")
end

-- the shape of a trainer's options (ck.train's and a family's), enough to map onto
local SPEC = {
  {heading = "the model"},
  {"pretrained-model-name-or-path", "string", nil, "the base model"},
  {"resolution", "list", "1024", "W,H or one number"},
  {"batch", "integer", 1, "samples per step", min = 1, also = {"auto"}},
  {"steps", "integer", 300, "batches to train", min = 1},
  {"seed", "integer", 1, "the seed", min = 0},
  {"rank", "integer", 4, "the adapters' rank", min = 1},
  {"alpha", "number", function(v) return v.rank end, "alpha", shown = "the rank"},
  {"optimizer", "choice", "adamw", "the optimizer", choices = {"adamw", "adamw8bit", "lion"}},
  {"lr", "number", 3e-3, "the learning rate"},
  {"max-grad-norm", "number", 1.0, "clipping", min = 0},
  {"lr-scheduler", "string", "constant", "the schedule"},
  {"lr-num-cycles", "number", nil, "cycles"},
  {"mixed-precision", "choice", "no", "16-bit storage", choices = {"no", "bf16", "fp16"}},
  {"checkpoint", "string", "none", "the checkpoint policy"},
  {"prediction", "choice", "eps", "what the model predicts", choices = {"eps", "v"}},
  {"save-lora-every", "integer", 0, "write every N steps", min = 0},
  {"shuffle-caption", "flag", false, "shuffle tags"},
  {"out", "string", "out/lora.safetensors", "the file written"},
  {"conv-rank", "integer", nil, "LoCon rank", min = 1},
}

-- kohya's names for ckrun's options, in ck.options' KOHYA form
local MAP = {
  learning_rate = {to = "lr"},
  unet_lr = {to = "lr"},
  network_dim = {to = "rank"},
  network_alpha = {to = "alpha"},
  train_batch_size = {to = "batch"},
  lr_scheduler_num_cycles = {to = "lr-num-cycles"},
  optimizer_type = {to = "optimizer", lower = true},
  use_8bit_adam = {to = "optimizer", value = "adamw8bit"},
  v_parameterization = {to = "prediction", value = "v"},
  gradient_checkpointing = {to = "checkpoint", value = "diffusers"},
  save_every_n_steps = {to = "save-lora-every"},
  max_train_steps = {to = "steps", says = "it counts updates; ckrun's --steps counts batches"},
  network_module = {to = "rank", says = "ckrun trains kohya's networks.lora; leave it out"},
}

---- --config-file

local RUN = [[
# kohya_ss writes a run's options in sections
[model_arguments]
pretrained_model_name_or_path = "sd_xl_base_1.0.safetensors"
v_parameterization = false

[additional_network_arguments]
network_dim = 16
network_alpha = 8.0

[optimizer_arguments]
optimizer_type = "AdamW8bit"
learning_rate = 1e-4
lr_scheduler = "cosine_with_restarts"
lr_scheduler_num_cycles = 3
max_grad_norm = 1.0

[training_arguments]
save_every_n_steps = 500
mixed_precision = "bf16"
seed = 42
gradient_checkpointing = true
shuffle_caption = true
resolution = [1024, 768]
]]

do
  local path = write("run.toml", RUN)
  local given, from = kc.options(path, SPEC, {kohya = MAP})
  local want = {["pretrained-model-name-or-path"] = "sd_xl_base_1.0.safetensors", rank = 16, alpha = 8.0,
    optimizer = "adamw8bit", lr = 1e-4, ["lr-scheduler"] = "cosine_with_restarts", ["lr-num-cycles"] = 3,
    ["max-grad-norm"] = 1.0, ["save-lora-every"] = 500, ["mixed-precision"] = "bf16", seed = 42,
    checkpoint = "diffusers", ["shuffle-caption"] = true, resolution = "1024,768"}
  local bad = {}
  for k, v in pairs(want) do
    if given[k] ~= v or math.type(given[k]) ~= math.type(v) then bad[#bad + 1] = k .. "=" .. tostring(given[k]) end
  end
  for k in pairs(given) do
    if want[k] == nil then bad[#bad + 1] = "extra " .. k end
  end
  T.ok(#bad == 0, "kohya_ss's sectioned config gives ckrun's options: underscore spellings, kohya's names (network_dim " ..
    "-> rank), flags for values (gradient_checkpointing -> checkpoint diffusers), optimizer_type lowercased, an array " ..
    "as W,H (" .. table.concat(bad, ", ") .. ")")
  T.ok(given.prediction == nil, "a kohya flag that is false gives nothing (v_parameterization = false)")
  T.ok(from.lr == path .. ":12" and from.rank == path .. ":7", "from: each option's file and line")
  local again = kc.options(path:gsub("%.toml$", ""), SPEC, {kohya = MAP})
  T.ok(again.lr == 1e-4, "a path without .toml gets it, as kohya does")
  local saved = options.KOHYA
  options.KOHYA = MAP
  local by_default = kc.options(path, SPEC)
  options.KOHYA = saved
  T.ok(by_default.rank == 16, "kohya's names come from ck.options' KOHYA table when no map is given")
end

local function config(name, text) return write(name, text) end

raises("an unknown key names the file, its line and the nearest name",
  "^out/test_kohya_config%.%d+/typo%.toml:3: unknown key lerning_rate %(did you mean learning_rate, ckrun's %-%-lr%?%)$",
  kc.options, config("typo.toml", "[optimizer_arguments]\nmax_grad_norm = 1\nlerning_rate = 1e-4\n"), SPEC, {kohya = MAP})
raises("an unknown key near a dashed ckrun name", "typo2%.toml:1: unknown key max_grad_nrom %(did you mean max%-grad%-norm%?%)",
  kc.options, config("typo2.toml", "max_grad_nrom = 1\n"), SPEC, {kohya = MAP})
raises("a key kohya means otherwise is refused with what ckrun has instead",
  "steps%.toml:2: max_train_steps is kohya's option: it counts updates; ckrun's %-%-steps counts batches",
  kc.options, config("steps.toml", "[training_arguments]\nmax_train_steps = 1600\n"), SPEC, {kohya = MAP})
raises("a value of the wrong type names the key, its option and the value",
  "type%.toml:2: learning_rate %(%-%-lr%) must be a number, got 'fast'",
  kc.options, config("type.toml", "[a]\nlearning_rate = 'fast'\n"), SPEC, {kohya = MAP})
raises("a value out of its option's range", "range%.toml:1: network_dim %(%-%-rank%) must be an integer >= 1, got 0",
  kc.options, config("range.toml", "network_dim = 0\n"), SPEC, {kohya = MAP})
raises("a choice the option lacks", "choice%.toml:1: optimizer_type %(%-%-optimizer%) must be adamw or adamw8bit or lion, got 'Prodigy'",
  kc.options, config("choice.toml", "optimizer_type = 'Prodigy'\n"), SPEC, {kohya = MAP})
raises("a key in two sections names both places", "twice%.toml:4: seed is given again %(first at .-twice%.toml:2 in %[a%]%)",
  kc.options, config("twice.toml", "[a]\nseed = 1\n[b]\nseed = 2\n"), SPEC, {kohya = MAP})
raises("two of kohya's names for one option", "two%.toml:2: unet_lr and learning_rate %(.-two%.toml:1%) both give %-%-lr",
  kc.options, config("two.toml", "learning_rate = 1e-4\nunet_lr = 2e-4\n"), SPEC, {kohya = MAP})
raises("a table inside a section", "nested%.toml:2: %[a%.b%] is a table inside a section",
  kc.options, config("nested.toml", "[a]\nb.c = 1\n"), SPEC, {kohya = MAP})
raises("a kohya flag given a word", "flag%.toml:1: use_8bit_adam is a flag %(kohya's; ckrun's %-%-optimizer adamw8bit%), got 'yes please'",
  kc.options, config("flag.toml", "use_8bit_adam = 'yes please'\n"), SPEC, {kohya = MAP})
raises("a file that is not TOML names its line and column", "^out/test_kohya_config%.%d+/bad%.toml: line 2, column 5: ",
  kc.options, config("bad.toml", "a = 1\nb = = 2\n"), SPEC, {kohya = MAP})
raises("a missing file", "cannot open '.-none%.toml'", kc.options, tmp .. "/none.toml", SPEC)

---- --dataset-config

-- kohya's sample (docs/config_README-en.md), its DreamBooth dataset
local DATASET = [==[
[general]
shuffle_caption = true
caption_extension = '.txt'
keep_tokens = 1

# This is a DreamBooth-style dataset
[[datasets]]
resolution = 512
batch_size = 4
keep_tokens = 2

  [[datasets.subsets]]
  image_dir = 'C:\hoge'
  class_tokens = 'hoge girl'
  # This subset uses keep_tokens = 2 (the value of the parent datasets)

  [[datasets.subsets]]
  image_dir = 'C:\fuga'
  class_tokens = 'fuga boy'
  keep_tokens = 3

  [[datasets.subsets]]
  is_reg = true
  image_dir = 'C:\reg'
  class_tokens = 'human'
  keep_tokens = 1
]==]

do
  local path = write("dataset.toml", DATASET)
  local d = kc.dataset(path)
  T.ok(#d.datasets == 1 and #d.subsets == 3 and d.datasets[1].subsets[3] == d.subsets[3], "one dataset of three subsets")
  local s1, s2, s3 = d.subsets[1], d.subsets[2], d.subsets[3]
  T.ok(s1.image_dir == "C:\\hoge" and s1.class_tokens == "hoge girl" and s1.keep_tokens == 2 and s2.keep_tokens == 3 and
    s3.keep_tokens == 1, "keep_tokens: the dataset's 2 where a subset gives none, else the subset's own")
  T.ok(s1.shuffle_caption == true and s3.caption_extension == ".txt",
    "[general]'s shuffle_caption and caption_extension reach every subset")
  T.ok(s1.is_reg == false and s3.is_reg == true, "is_reg: a regularization subset, false by default")
  T.ok(s1.num_repeats == 1 and s1.flip_aug == false and s1.caption_dropout_rate == 0 and s1.caption_separator == "," and
    s1.token_warmup_min == 1, "kohya's defaults for what no level gives")
  T.ok(s2.resolution[1] == 512 and s2.resolution[2] == 512 and s2.batch_size == 4 and s2.dataset == 1 and
    s2.enable_bucket == false and s2.min_bucket_reso == 256 and s2.bucket_reso_steps == 64,
    "every subset carries its dataset's settings: resolution 512 as 512x512, batch_size 4, kohya's bucket defaults")
  T.ok(s1.at == path .. ":12" and s3.at == path .. ":22" and d.datasets[1].at == path .. ":7",
    "each subset and dataset says where its header is")
  T.ok(s1.from.keep_tokens == path .. ":10" and s2.from.keep_tokens == path .. ":20" and
    s1.from.shuffle_caption == path .. ":2" and s1.from.num_repeats == nil,
    "from: the line each value came from, nothing for a default")
  T.ok(#d.ignored == 0, "nothing left out")
end

do
  local d = kc.dataset(write("wild.toml", [==[
[general]
flip_aug = true
color_aug = false
resolution = [1024, 768]

[[datasets]]
batch_size = 6
enable_bucket = true
bucket_no_upscale = true
caption_extension = ".txt"
keep_tokens_separator= "|||"
shuffle_caption = true
caption_tag_dropout_rate = 0.1
secondary_separator = ";;;"
enable_wildcard = true

  [[datasets.subsets]]
  image_dir = "/path/to/image_dir"
  num_repeats = 1
  caption_prefix = "1girl, hatsune miku, vocaloid |||"
  caption_suffix = ", anime screencap ||| masterpiece, rating: general"
]==]))
  local s = d.subsets[1]
  T.ok(s.flip_aug == true and s.resolution[1] == 1024 and s.resolution[2] == 768 and s.batch_size == 6 and
    s.enable_bucket == true and s.bucket_no_upscale == true and s.keep_tokens_separator == "|||" and
    s.secondary_separator == ";;;" and s.caption_tag_dropout_rate == 0.1 and s.enable_wildcard == true and
    s.caption_prefix == "1girl, hatsune miku, vocaloid |||", "kohya's second sample: [W, H], buckets, separators, wildcards")
end

do -- the command line's options between [general] and kohya's defaults; the file wins over them
  local text = "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n[[datasets.subsets]]\nimage_dir = 'b'\nnum_repeats = 3\n" ..
    "caption_extension = '.cap'\n"
  local d = kc.dataset(write("args.toml", text),
    {args = {resolution = {"768", "512"}, batch = 2, ["caption-extension"] = ".txt", ["keep-tokens"] = 1}})
  local a, b = d.subsets[1], d.subsets[2]
  T.ok(a.resolution[1] == 768 and a.resolution[2] == 512 and a.from.resolution == "--resolution" and a.batch_size == 2 and
    a.from.batch_size == "--batch", "--resolution W,H and --batch fill what the file leaves out")
  T.ok(a.caption_extension == ".txt" and b.caption_extension == ".cap" and b.num_repeats == 3 and a.keep_tokens == 1,
    "a subset's own caption_extension wins over --caption-extension")
  local d2 = kc.dataset(write("args2.toml", "[general]\nresolution = 640\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n"),
    {args = {resolution = 1024}})
  T.ok(d2.subsets[1].resolution[1] == 640, "[general] wins over --resolution")
end

do
  local d = kc.dataset(write("dup.toml", "[general]\nresolution = 512\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n" ..
    "[[datasets.subsets]]\nimage_dir = 'a'\nnum_repeats = 5\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n"))
  T.ok(#d.subsets == 2 and d.subsets[1].num_repeats == 1 and d.subsets[2].dataset == 2 and #d.ignored == 1 and
    d.ignored[1]:find("dup%.toml:6: a second subset of image_dir 'a' in dataset 1") ~= nil,
    "a second subset of one image_dir in a dataset is left out as kohya does, and said; in another dataset it counts")
end

do
  local d = kc.dataset(write("steps.toml", "[general]\nresolution = 512\nenable_bucket = true\nmin_bucket_reso = 300\n" ..
    "max_bucket_reso = 1000\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n"))
  T.ok(d.datasets[1].min_bucket_reso == 256 and d.datasets[1].max_bucket_reso == 1024 and #d.ignored == 1 and
    d.ignored[1]:find("moved to 256 and 1024") ~= nil, "bucket limits move to multiples of bucket_reso_steps, as kohya's do")
end

do
  local json = write("dataset.json", '{"general": {"shuffle_caption": true}, "datasets": [{"resolution": [512, 512], ' ..
    '"subsets": [{"image_dir": "x", "num_repeats": 2}]}]}')
  local d = kc.dataset(json)
  T.ok(d.subsets[1].num_repeats == 2 and d.subsets[1].shuffle_caption == true and d.subsets[1].at == json,
    "a JSON dataset config reads as kohya reads it (places name the file alone)")
end

local function ds(name, text, opts) return function() return kc.dataset(write(name, text), opts) end end
local SUB = "[[datasets]]\nresolution = 512\n[[datasets.subsets]]\nimage_dir = 'a'\n"
raises("a dataset's setting in a subset", "level%.toml:5: batch_size is a dataset's setting: it goes in %[general%] or " ..
  "%[%[datasets%]%], not in %[%[datasets%.subsets%]%]", ds("level.toml", SUB .. "batch_size = 2\n"))
raises("a subset's own setting in [general]", "level2%.toml:2: is_reg is a subset's own setting: it goes in " ..
  "%[%[datasets%.subsets%]%], not in %[general%]", ds("level2.toml", "[general]\nis_reg = true\n" .. SUB))
raises("an unknown key names the nearest", "typo%.toml:5: unknown key num_repeat in %[%[datasets%.subsets%]%] " ..
  "%(did you mean num_repeats%?%)", ds("typo.toml", SUB .. "num_repeat = 2\n"))
raises("num_repeats below 1", "rep%.toml:5: num_repeats must be >= 1, got 0", ds("rep.toml", SUB .. "num_repeats = 0\n"))
raises("a negative keep_tokens", "keep%.toml:5: keep_tokens must be >= 0, got %-1", ds("keep.toml", SUB .. "keep_tokens = -1\n"))
raises("a rate past 1", "rate%.toml:5: caption_dropout_rate must be in %[0, 1%], got 1%.5",
  ds("rate.toml", SUB .. "caption_dropout_rate = 1.5\n"))
raises("a boolean given as a word", "bool%.toml:5: shuffle_caption must be true or false, got 'yes'",
  ds("bool.toml", SUB .. "shuffle_caption = 'yes'\n"))
raises("a fractional repeat count", "frac%.toml:5: num_repeats must be a whole number >= 1, got 1%.5",
  ds("frac.toml", SUB .. "num_repeats = 1.5\n"))
raises("a resolution of one side in a list", "res%.toml:2: resolution must be a whole number of pixels or %[width, height%]",
  ds("res.toml", "[[datasets]]\nresolution = [512]\n[[datasets.subsets]]\nimage_dir = 'a'\n"))
raises("an empty image_dir", "empty%.toml:4: image_dir must not be empty", ds("empty.toml", SUB:gsub("'a'", "''") .. ""))
raises("a subset without image_dir", "nodir%.toml:3: subset 1 of dataset 1 has no image_dir",
  ds("nodir.toml", "[[datasets]]\nresolution = 512\n[[datasets.subsets]]\nnum_repeats = 2\n"))
raises("a dataset without a resolution", "nores%.toml:1: dataset 1 has no resolution: give resolution = W or %[W, H%]",
  ds("nores.toml", "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n"))
raises("a dataset without subsets", "nosub%.toml:1: dataset 1 has no subsets", ds("nosub.toml", "[[datasets]]\nresolution = 512\n"))
raises("no datasets", "nods%.toml: no %[%[datasets%]%]", ds("nods.toml", "[general]\nresolution = 512\n"))
raises("an unknown top-level key", "top%.toml:1: unknown key dataset at the top of the dataset config .*%(did you mean datasets%?%)",
  ds("top.toml", "[[dataset]]\nresolution = 512\n"))
raises("a fine-tuning subset", "ft%.toml:5: fine%-tuning subsets %(metadata_file%) are not read by ckrun",
  ds("ft.toml", SUB .. "metadata_file = 'md.json'\n"))
raises("a resolution outside the buckets", "bucket%.toml:2: resolution 2048x2048 does not fit the buckets' sides 256 to 1024",
  ds("bucket.toml", "[general]\nresolution = 2048\nenable_bucket = true\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n"))
raises("a setting the trainer does not take, with supports", "sup%.toml:5: color_aug = true is kohya's setting that " ..
  "ckrun's trainer does not take", ds("sup.toml", SUB .. "color_aug = true\n", {supports = {"image_dir", "num_repeats", "resolution"}}))
do
  local ok = pcall(kc.dataset, write("sup2.toml", SUB .. "color_aug = false\n"), {supports = {"image_dir", "resolution"}})
  T.ok(ok, "a setting at kohya's default passes whatever the trainer supports")
end
raises("a setting without a default, given, is one the trainer must support", "sup3%.toml:5: class_tokens = 'dog' is " ..
  "kohya's setting that ckrun's trainer does not take", ds("sup3.toml", SUB .. "class_tokens = 'dog'\n", {supports = {"image_dir", "resolution"}}))
raises("a --resolution that is not one", "%-%-resolution: resolution %(kohya's resolution%) must be a whole number of " ..
  "pixels or %[width, height%], got 'big'", ds("argres.toml", "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'a'\n",
  {args = {resolution = "big"}}))
raises("a deep TOML file is refused by the reader, naming it", "deep%.toml: line 1, column 1: tables and arrays nest",
  ds("deep.toml", ("a."):rep(40) .. "b = 1\n"))

T.done()
