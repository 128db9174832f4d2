-- Text to image with an SDXL model and LoRA adapters (ck.pipeline): the
-- prompt through both text encoders, the UNet with classifier-free guidance
-- for --steps of the sampler, the VAE decoder, a PNG whose tEXt
-- "parameters" chunk holds the settings in A1111's format.
--
--   ckrun scripts/generate.lua --prompt "a red circle" --out out/a.png          the tiny random model
--   ckrun scripts/generate.lua --pretrained-model-name-or-path sd_xl_base_1.0.safetensors \
--       --tokenizer bpe_simple_vocab_16e6.txt.gz --lora out/lora.safetensors:0.8 \
--       --prompt "a photo of a cat" --width 1024 --height 1024 --steps 30 --cfg-scale 5 --out out/cat.png
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
  about = "Makes an image from a prompt with an SDXL model (and LoRA adapters) and writes it as a PNG.",
  {"pretrained-model-name-or-path", "string", nil, "the base model: an SDXL single-file checkpoint or a diffusers " ..
   "folder (default: the tiny random model of --seed-weights)", arg = "PATH"},
  {"tokenizer", "string", nil, "CLIP's tokenizer for both encoders, in place of the base's folders: open_clip's " ..
   "bpe_simple_vocab_16e6.txt.gz, a tokenizer folder or a tokenizer.json", arg = "FILE|DIR"},
  {"caption-fix", "choice", "ftfy", "prompts cleaned before tokenizing by ftfy's fix_text (as kohya's installs do) " ..
   "or not", choices = {"ftfy", "none"}},
  {"seed-weights", "integer", 1, "the tiny random model's weight seed", min = 0},
  {"lora", "string", nil, "LoRA files in kohya's naming (LoCon too), each at a strength (default 1): " ..
   "a comma-separated list, or --lora again for each", arg = "FILE[:STRENGTH],...", repeats = true},
  {"prompt", "string", "", "the prompt"},
  {"negative-prompt", "string", nil, "the negative prompt (default: none; SDXL then guides away from zero " ..
   "embeddings, as diffusers)"},
  {"width", "integer", base_or_tiny(1024, 256), "pixels (a multiple of 8)", arg = "PX",
   shown = "1024 with a base model, else 256", min = 8},
  {"height", "integer", base_or_tiny(1024, 256), "pixels (a multiple of 8)", arg = "PX",
   shown = "1024 with a base model, else 256", min = 8},
  {"steps", "integer", 30, "sampler steps", min = 1},
  {"cfg-scale", "number", 5.0, "classifier-free guidance scale (diffusers' guidance_scale; 1: none)", min = 0},
  {"seed", "integer", 0, "the seed of the initial noise (and euler_a's)", min = 0},
  {"sampler", "choice", nil, "the sampler", choices = samplers.NAMES,
   shown = "the diffusers folder's scheduler class, else euler"},
  {"prediction", "choice", nil, "what the UNet predicts (v for v-prediction models)", choices = {"eps", "v"},
   shown = "the diffusers folder's prediction_type, else eps"},
  {"out", "string", "out/image.png", "the PNG written (whole, renamed into place)", arg = "PNG",
   check = options.file_to_write, says = options.FILE_TO_WRITE},
})
if not o then return end

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

local base_path = o["pretrained-model-name-or-path"]
local base = base_path and checkpoint.open(base_path) or nil
-- a diffusers folder's scheduler/scheduler_config.json: its schedule, prediction and sampler, as diffusers runs it
local pipe <close> = pipeline.new{models = require("ck.encode").models{base = base, seed = o["seed-weights"],
  tokenizer = o.tokenizer, caption_fix = o["caption-fix"]},
  name = base_path and base_path:gsub("/+$", ""):match("([^/]+)$"):gsub("%.safetensors$", "") or nil,
  scheduler = pipeline.scheduler(base)}
local t0 = ck.now()
local image, settings = pipe:generate{prompt = o.prompt, negative_prompt = o["negative-prompt"], width = o.width,
  height = o.height, steps = o.steps, cfg = o["cfg-scale"], seed = o.seed, sampler = o.sampler, loras = loras,
  prediction = o.prediction}
local text = pipeline.parameters(settings)
local dir = o.out:match("^(.*)/[^/]*$")
if dir and dir ~= "" then assert(ck.mkdir(dir)) end
ck.write_png(o.out, image, {text = {parameters = text}})
print(string.format("wrote %s (%dx%d, %d steps of %s in %.1f s)", o.out, o.width, o.height, o.steps, settings.sampler,
  ck.now() - t0))
