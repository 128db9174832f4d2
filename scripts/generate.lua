-- Text to image with an SDXL or a Flux.1 model, the family picked from the
-- checkpoint: a Flux transformer (Black Forest Labs' single file, or a
-- diffusers folder with transformer/) runs ck.flux_pipeline (T5 and CLIP-L,
-- the flow-matching Euler sampler with the resolution-dependent shift,
-- FLUX.1-dev's embedded guidance); anything else ck.pipeline (SDXL: both text
-- encoders, the UNet with classifier-free guidance, LoRA adapters). The PNG's
-- tEXt "parameters" chunk holds the settings in A1111's format.
--
--   ckrun scripts/generate.lua --prompt "a red circle" --out out/a.png          the tiny random SDXL model
--   ckrun scripts/generate.lua --pretrained-model-name-or-path sd_xl_base_1.0.safetensors \
--       --tokenizer bpe_simple_vocab_16e6.txt.gz --lora out/lora.safetensors:0.8 \
--       --prompt "a photo of a cat" --width 1024 --height 1024 --steps 30 --cfg-scale 5 --out out/cat.png
--   ckrun scripts/generate.lua --pretrained-model-name-or-path FLUX.1-dev --mixed-precision bf16 \
--       --prompt "a photo of a cat" --steps 28 --guidance-scale 3.5 --out out/cat.png
--
--   ckrun scripts/generate.lua --help              the options
local ck = require "ck"
local options = require "ck.options"
local pipeline = require "ck.pipeline"
local samplers = require "ck.samplers"
local checkpoint = require "ck.checkpoint"

local function base_or_tiny(base, tiny)
  return function(v) if v["pretrained-model-name-or-path"] then return base end return tiny end
end
local o = options.parse(args, {
  about = "Makes an image from a prompt with an SDXL or a Flux.1 model (the family from the checkpoint) and " ..
    "writes it as a PNG.",
  {"pretrained-model-name-or-path", "string", nil, "the base model: an SDXL single-file checkpoint or diffusers " ..
   "folder, or a Flux.1 transformer (Black Forest Labs' single file, or a diffusers folder with transformer/) " ..
   "(default: the tiny random SDXL model of --seed-weights)", arg = "PATH"},
  {"tokenizer", "string", nil, "CLIP's tokenizer, in place of the base's folders (SDXL: for both encoders): open_clip's " ..
   "bpe_simple_vocab_16e6.txt.gz, a tokenizer folder or a tokenizer.json", arg = "FILE|DIR"},
  {"caption-fix", "choice", "ftfy", "prompts cleaned before CLIP's tokenizer by ftfy's fix_text (as kohya's installs " ..
   "do) or not", choices = {"ftfy", "none"}},
  {"seed-weights", "integer", 1, "the tiny random SDXL model's weight seed", min = 0},
  {"lora", "string", nil, "SDXL: LoRA files in kohya's naming (LoCon too), each at a strength (default 1): " ..
   "a comma-separated list, or --lora again for each", arg = "FILE[:STRENGTH],...", repeats = true},
  {"prompt", "string", "", "the prompt"},
  {"negative-prompt", "string", nil, "SDXL: the negative prompt (default: none; SDXL then guides away from zero " ..
   "embeddings, as diffusers)"},
  {"width", "integer", nil, "pixels (SDXL: a multiple of 8; Flux: of 16)", arg = "PX",
   shown = "1024 with a base model, else 256", min = 8},
  {"height", "integer", nil, "pixels (SDXL: a multiple of 8; Flux: of 16)", arg = "PX",
   shown = "1024 with a base model, else 256", min = 8},
  {"steps", "integer", nil, "sampler steps", min = 1, shown = "30; Flux: 28, schnell 4"},
  {"cfg-scale", "number", nil, "SDXL: classifier-free guidance scale (diffusers' guidance_scale; 1: none)", min = 0,
   shown = "5.0"},
  {"seed", "integer", 0, "the seed of the initial noise (and euler_a's)", min = 0},
  {"sampler", "choice", nil, "SDXL: the sampler", choices = samplers.NAMES,
   shown = "the diffusers folder's scheduler class, else euler"},
  {"prediction", "choice", nil, "SDXL: what the UNet predicts (v for v-prediction models)", choices = {"eps", "v"},
   shown = "the diffusers folder's prediction_type, else eps"},
  -- Flux's
  {"guidance-scale", "number", nil, "Flux: the guidance FLUX.1-dev's guidance embedding sees (diffusers' " ..
   "guidance_scale; schnell has none)", min = 0, shown = "3.5"},
  {"shift", "number", nil, "Flux: a static shift s t / (1 + (s - 1) t) of the sigmas in place of the " ..
   "resolution-dependent one (mu from 0.5 at 256 image tokens to 1.15 at 4096)", above = 0,
   shown = "the scheduler's: FLUX.1-dev's resolution-dependent shift, schnell's none"},
  {"t5xxl-max-token-length", "integer", nil, "Flux: T5's tokens (the prompt truncated, padded)", min = 1,
   shown = "512; schnell 256"},
  {"ae", "string", nil, "Flux: the VAE, a diffusers vae/ folder, or a file in its names or Black Forest Labs' " ..
   "(ae.safetensors) (default: the folder's vae/)", arg = "PATH"},
  {"clip-l", "string", nil, "Flux: CLIP-L, a transformers folder or a file in its names such as ComfyUI's " ..
   "clip_l.safetensors (default: the folder's text_encoder/)", arg = "PATH"},
  {"t5xxl", "string", nil, "Flux: T5-XXL's encoder, a transformers folder or a file such as t5xxl_fp16.safetensors " ..
   "(default: the folder's text_encoder_2/)", arg = "PATH"},
  {"t5-tokenizer", "string", nil, "Flux: T5's tokenizer, a folder, spiece.model or tokenizer.json (default: the " ..
   "folder's tokenizer_2/)", arg = "PATH"},
  {"mixed-precision", "choice", "no", "Flux: bf16 stores the activations and frozen weights of the transformer " ..
   "and T5 in bf16", choices = {"no", "bf16"}},
  {"fp8-base", "flag", false, "Flux: the transformer's and T5's frozen weights stored in fp8 e4m3"},
  {"out", "string", "out/image.png", "the PNG written (whole, renamed into place)", arg = "PNG",
   check = options.file_to_write, says = options.FILE_TO_WRITE},
})
if not o then return end

local base_path = o["pretrained-model-name-or-path"]
local flux_desc = base_path and require("ck.flux_keys").identify(base_path)

-- the options of the other family: refused, naming the one given and why
local SDXL_ONLY = {"seed-weights", "lora", "negative-prompt", "cfg-scale", "sampler", "prediction"}
local FLUX_ONLY = {"guidance-scale", "shift", "t5xxl-max-token-length", "ae", "clip-l", "t5xxl", "t5-tokenizer",
                   "mixed-precision", "fp8-base"}
local function refuse(list, why)
  for _, name in ipairs(list) do
    if o:given(name) then error("--" .. name .. " " .. why, 0) end
  end
end

local t0 = ck.now()
local image, text, settings
if flux_desc then
  refuse(SDXL_ONLY, string.format("is SDXL's; %s is a Flux model: no negative prompt, CFG or sampler choice " ..
    "(FLUX.1-dev is guided by --guidance-scale), and no LoRA files yet", base_path))
  local flux_pipeline = require "ck.flux_pipeline"
  local d = flux_pipeline.open(base_path, {vae = o.ae, clip_l = o["clip-l"], t5xxl = o.t5xxl, tokenizer = o.tokenizer,
    t5_tokenizer = o["t5-tokenizer"], caption_fix = o["caption-fix"]})
  if o:given("guidance-scale") and not d.config.guidance_embeds then
    error(string.format("--guidance-scale: %s has no guidance embedding (as FLUX.1-schnell): give no guidance", base_path),
      0)
  end
  local pipe <close> = flux_pipeline.new{model = d, precision = o["mixed-precision"], frozen = o["fp8-base"] and "fp8"
    or nil, t5_max_length = o["t5xxl-max-token-length"]}
  image, settings = pipe:generate{prompt = o.prompt, width = o.width, height = o.height, steps = o.steps,
    guidance = o["guidance-scale"], seed = o.seed, shift = o.shift}
  text = flux_pipeline.parameters(settings)
else
  refuse(FLUX_ONLY, string.format("applies to Flux models only; %s is SDXL's",
    base_path and ("'" .. base_path .. "'") or "the tiny random model"))
  -- --lora a.safetensors:0.8,b.safetensors --lora c.safetensors
  local loras = {}
  for _, given in ipairs(o.lora or {}) do
    for _, item in ipairs(options.types.list(nil, given)) do
      local path, s = item:match("^(.*):([-+%d.eE]+)$")
      local strength = s and tonumber(s)
      if not path or not strength then path, strength = item, 1.0 end
      loras[#loras + 1] = {path, strength}
    end
  end
  local base = base_path and checkpoint.open(base_path) or nil
  -- a diffusers folder's scheduler/scheduler_config.json: its schedule, prediction and sampler, as diffusers runs it
  local pipe <close> = pipeline.new{models = require("ck.encode").models{base = base, seed = o["seed-weights"],
    tokenizer = o.tokenizer, caption_fix = o["caption-fix"]},
    name = base_path and base_path:gsub("/+$", ""):match("([^/]+)$"):gsub("%.safetensors$", "") or nil,
    scheduler = pipeline.scheduler(base)}
  local size = base_or_tiny(1024, 256)(o)
  image, settings = pipe:generate{prompt = o.prompt, negative_prompt = o["negative-prompt"], width = o.width or size,
    height = o.height or size, steps = o.steps or 30, cfg = o["cfg-scale"] or 5.0, seed = o.seed, sampler = o.sampler,
    loras = loras, prediction = o.prediction}
  text = pipeline.parameters(settings)
end
local dir = o.out:match("^(.*)/[^/]*$")
if dir and dir ~= "" then assert(ck.mkdir(dir)) end
ck.write_png(o.out, image, {text = {parameters = text}})
print(string.format("wrote %s (%dx%d, %d steps of %s in %.1f s)", o.out, settings.width, settings.height,
  settings.steps, settings.sampler, ck.now() - t0))
