-- LoRA adapters on ck.nn Linear modules (y = W x + b + alpha/rank * up(down(x))),
-- and with conv_rank on the convolutions of the UNet's resnets, downsamplers
-- and upsamplers as kohya's LoCon (conv_dim) does; the names users' tools
-- expect: kohya's SGM-based names and PEFT's.
local ck = require "ck"
local nn = require "ck.nn"

local lora = {}

lora.DEFAULT_TARGETS = {"to_q", "to_k", "to_v", "to_out.0"}
-- kohya adapts every Linear inside each Transformer2DModel
lora.KOHYA_TARGETS = {"to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2", "proj_in", "proj_out"}

local function split(path)
  local t = {}
  for c in path:gmatch("[^.]+") do t[#t + 1] = c end
  return t
end

-- true when the components of target are the last components of path
local function tail_matches(parts, target)
  local tp = split(target)
  if #tp > #parts then return false end
  for i = 1, #tp do
    if parts[#parts - #tp + i] ~= tp[i] then return false end
  end
  return true
end

-- kohya's init: lora_down kaiming-uniform (U(+-1/sqrt(fan_in))), lora_up zeros,
-- so a fresh adapter leaves the output unchanged; dropout (kohya's
-- network_dropout) on lora_down's output while training; lora_up learns at
-- loraplus_lr_ratio times the learning rate (LoRA+, Hayou et al. 2024)
-- y + scale * up(dropout(down(x))): down_op and up_op apply the weights
local function with_branch(self, g, x, y, down_shape, up_shape, down_op, up_op)
  local a = self.lora
  local down = g:param("lora_down.weight", down_shape, {trainable = true, init = "kaiming"})
  local up = g:param("lora_up.weight", up_shape, {trainable = true, init = "zeros", lr_scale = a.up_lr_scale})
  local d = down_op(x, down)
  if a.dropout > 0 then d = ck.dropout(d, a.dropout) end
  d = up_op(d, up)
  if a.scale ~= 1 then d = d * a.scale end
  return y + d
end

local function adapted_linear(self, g, x)
  local r = self.lora.rank
  return with_branch(self, g, x, nn.Linear.updateOutput(self, g, x), {r, self.in_features}, {self.out_features, r},
                     ck.linear, ck.linear)
end

-- a convolution's adapter, as kohya's: down is the module's kernel, stride and
-- padding onto rank channels, up a 1x1 convolution back
local function adapted_conv(self, g, x)
  local r, k = self.lora.rank, self.kernel
  local o = {stride = self.stride, padding = self.padding}
  return with_branch(self, g, x, nn.Conv2d.updateOutput(self, g, x), {r, self.in_channels, k, k},
                     {self.out_channels, r, 1, 1}, function(v, w) return ck.conv2d(v, w, nil, o) end, ck.conv2d)
end

-- the modules whose convolutions and Linears conv_rank adapts (kohya's
-- UNET_TARGET_REPLACE_MODULE_CONV2D_3X3)
local CONV_BLOCKS = {["nn.ResnetBlock2D"] = true, ["nn.Downsample2D"] = true, ["nn.Upsample2D"] = true}

-- lora.attach(model, {rank=4, alpha=rank, targets={...} | "kohya" | "default",
--                     conv_rank=nil, conv_alpha=conv_rank, dropout=0, loraplus_lr_ratio=1})
-- marks every Linear whose path ends in a target; with conv_rank, also every
-- Conv2d and Linear directly inside a ResnetBlock2D, Downsample2D or
-- Upsample2D, as kohya's LoCon: 3x3 convolutions at conv_rank/conv_alpha,
-- 1x1 convolutions and Linears (conv_shortcut, time_emb_proj) at rank/alpha.
-- Call before model:forward. Returns a handle: rank, alpha, scale, conv_rank,
-- conv_alpha, targets, paths (diffusers module paths, tree order),
-- peft_targets (PEFT's target_modules for exactly these modules), adapters
-- ({path, module, kind = "linear"|"conv", in_features, out_features (channels
-- for a conv), kernel, rank, alpha, down, up} with down/up the parameter
-- names), param_count().
function lora.attach(model, opts)
  opts = opts or {}
  local rank = opts.rank or 4
  local alpha = opts.alpha or rank
  local conv_rank = opts.conv_rank
  local conv_alpha = opts.conv_alpha or conv_rank
  local dropout = opts.dropout or 0
  assert(type(dropout) == "number" and dropout >= 0 and dropout < 1, "lora.attach: dropout must be in [0, 1)")
  local ratio = opts.loraplus_lr_ratio or 1
  assert(type(ratio) == "number" and ratio > 0, "lora.attach: loraplus_lr_ratio must be a positive number")
  local targets = opts.targets or lora.DEFAULT_TARGETS
  if targets == "kohya" then targets = lora.KOHYA_TARGETS end
  if targets == "default" then targets = lora.DEFAULT_TARGETS end
  assert(type(targets) == "table" and #targets > 0, "lora.attach: targets must be a non-empty list")
  assert(math.type(rank) == "integer" and rank > 0, "lora.attach: rank must be a positive integer")
  assert(conv_rank == nil or (math.type(conv_rank) == "integer" and conv_rank > 0),
    "lora.attach: conv_rank must be a positive integer")
  local h = {rank = rank, alpha = alpha, scale = alpha / rank, conv_rank = conv_rank, conv_alpha = conv_alpha,
             dropout = dropout, loraplus_lr_ratio = ratio,
             targets = targets, paths = {}, adapters = {}, config = model.config}
  local adapted, named = {}, {} -- paths adapted; paths a target names
  local function add(path, m, r, a)
    if m.lora or m.flux_lora then error("lora.attach: '" .. path .. "' already has an adapter", 3) end
    local conv = getmetatable(m) == nn.Conv2d
    m.lora = {rank = r, alpha = a, scale = a / r, dropout = dropout, up_lr_scale = ratio}
    m.updateOutput = conv and adapted_conv or adapted_linear
    adapted[path] = true
    h.paths[#h.paths + 1] = path
    h.adapters[#h.adapters + 1] = {path = path, module = m, kind = conv and "conv" or "linear",
      in_features = conv and m.in_channels or m.in_features, out_features = conv and m.out_channels or m.out_features,
      kernel = conv and m.kernel or 1, rank = r, alpha = a,
      down = path .. ".lora_down.weight", up = path .. ".lora_up.weight"}
  end
  local modules = model:named_modules(opts.prefix or "")
  local blocks = {}
  if conv_rank then
    for _, e in ipairs(modules) do
      if CONV_BLOCKS[getmetatable(e[2]).__name] then blocks[e[1]] = true end
    end
  end
  for _, e in ipairs(modules) do
    local path, m = e[1], e[2]
    local mt = getmetatable(m)
    if blocks[path:match("^(.*)%.[^.]+$") or ""] and (mt == nn.Linear or mt == nn.Conv2d) then
      if mt == nn.Conv2d and m.kernel > 1 then add(path, m, conv_rank, conv_alpha) else add(path, m, rank, alpha) end
    elseif mt == nn.Linear then
      local parts = split(path)
      for _, t in ipairs(targets) do
        if tail_matches(parts, t) then
          add(path, m, rank, alpha)
          break
        end
      end
    end
  end
  -- PEFT's target_modules (a module is targeted when its path is a name or
  -- ends in "." .. name): the targets themselves when every module they name
  -- is adapted (not so when one names, say, a LayerNorm), else every adapted
  -- path; and the paths LoCon adapts besides
  local exact = true
  for _, e in ipairs(modules) do
    if e[1] ~= "" then
      local parts = split(e[1])
      for _, t in ipairs(targets) do
        if tail_matches(parts, t) then
          named[e[1]] = true
          if not adapted[e[1]] then exact = false end
          break
        end
      end
    end
  end
  h.peft_targets = {}
  if exact then
    for _, t in ipairs(targets) do h.peft_targets[#h.peft_targets + 1] = t end
  end
  for _, p in ipairs(h.paths) do
    if not (exact and named[p]) then h.peft_targets[#h.peft_targets + 1] = p end
  end
  function h.param_count()
    local n = 0
    for _, a in ipairs(h.adapters) do n = n + a.rank * (a.in_features * a.kernel * a.kernel + a.out_features) end
    return n
  end
  return h
end

---- names

local resnet_parts = {
  norm1 = "in_layers.0", conv1 = "in_layers.2", time_emb_proj = "emb_layers.1",
  norm2 = "out_layers.0", conv2 = "out_layers.3", conv_shortcut = "skip_connection",
}

local function resnet_rest(rest)
  if rest == "" then return "" end
  local first, more = rest:match("^%.([^.]+)(.*)$")
  return "." .. (resnet_parts[first] or first) .. more
end

-- lora.sgm_path(diffusers module path [, config]) -> the Stability (SGM) path,
-- e.g. down_blocks.1.attentions.0.proj_in -> input_blocks.4.1.proj_in.
-- config (diffusers keys) gives layers_per_block and which up blocks have
-- attention; the default is SDXL's layout.
function lora.sgm_path(path, config)
  local lpb = config and config.layers_per_block or 2
  assert(type(lpb) == "number", "sgm_path: layers_per_block must be one number")
  local up_types = config and config.up_block_types or {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"}
  local n = lpb + 1
  local fixed = {
    {"^conv_in", "input_blocks.0.0"},
    {"^time_embedding%.linear_1", "time_embed.0"},
    {"^time_embedding%.linear_2", "time_embed.2"},
    {"^add_embedding%.linear_1", "label_emb.0.0"},
    {"^add_embedding%.linear_2", "label_emb.0.2"},
    {"^conv_norm_out", "out.0"},
    {"^conv_out", "out.2"},
  }
  for _, f in ipairs(fixed) do
    local s, e = path:find(f[1])
    if s and (e == #path or path:sub(e + 1, e + 1) == ".") then return f[2] .. path:sub(e + 1) end
  end
  local i, j, rest = path:match("^down_blocks%.(%d+)%.resnets%.(%d+)(.*)$")
  if i then return string.format("input_blocks.%d.0", 1 + n * i + j) .. resnet_rest(rest) end
  i, j, rest = path:match("^down_blocks%.(%d+)%.attentions%.(%d+)(.*)$")
  if i then return string.format("input_blocks.%d.1", 1 + n * i + j) .. rest end
  i, rest = path:match("^down_blocks%.(%d+)%.downsamplers%.0%.conv(.*)$")
  if i then return string.format("input_blocks.%d.0.op", n * (i + 1)) .. rest end
  j, rest = path:match("^mid_block%.resnets%.(%d+)(.*)$")
  if j then return string.format("middle_block.%d", 2 * j) .. resnet_rest(rest) end
  j, rest = path:match("^mid_block%.attentions%.(%d+)(.*)$")
  if j then return string.format("middle_block.%d", 2 * j + 1) .. rest end
  i, j, rest = path:match("^up_blocks%.(%d+)%.resnets%.(%d+)(.*)$")
  if i then return string.format("output_blocks.%d.0", n * i + j) .. resnet_rest(rest) end
  i, j, rest = path:match("^up_blocks%.(%d+)%.attentions%.(%d+)(.*)$")
  if i then return string.format("output_blocks.%d.1", n * i + j) .. rest end
  i, rest = path:match("^up_blocks%.(%d+)%.upsamplers%.0%.conv(.*)$")
  if i then
    local t = up_types[tonumber(i) + 1] or ""
    local slot = t:find("CrossAttn", 1, true) and 2 or 1
    return string.format("output_blocks.%d.%d.conv", n * i + lpb, slot) .. rest
  end
  error("sgm_path: no SGM name for '" .. path .. "'", 2)
end

-- lora.kohya_name(path [, config]): "lora_unet_" .. SGM path with dots as underscores
function lora.kohya_name(path, config)
  return "lora_unet_" .. lora.sgm_path(path, config):gsub("%.", "_")
end

---- files
--
-- Format "kohya" (the default) is one file: kohya's names, an alpha tensor per
-- module, ss_* and ModelSpec metadata. Loaded by ComfyUI, A1111/Forge, kohya's
-- scripts and diffusers' load_lora_weights.
--
-- Format "peft" is OUT plus two files in OUT's folder:
--   OUT: unet.<module>.lora_A.weight / lora_B.weight, as diffusers'
--     save_lora_weights writes them, with the safetensors metadata
--     lora_adapter_metadata: JSON of the LoraConfig fields (r, lora_alpha,
--     target_modules, rank_pattern, alpha_pattern, ...) with "unet." before
--     each name. diffusers' pipe.load_lora_weights(OUT) (StableDiffusionXL)
--     builds its LoraConfig from that JSON alone, so each module runs at
--     alpha/r; without it diffusers takes lora_alpha = r (scaling 1.0).
--     Give diffusers the file's path: given the folder, it picks one of the
--     .safetensors files there by guesswork.
--   adapter_config.json: the same fields, as peft's save_pretrained writes them;
--   adapter_model.safetensors: the same tensors named
--     base_model.model.<module>.lora_A.weight, as save_pretrained names them,
--   so that peft.PeftModel.from_pretrained(unet, folder) loads the folder. The
--   weights are in both files: no one layout loads in both diffusers' pipeline
--   (it keeps the keys under "unet.") and PeftModel (under "base_model.model.").
--   A later save into the same folder replaces the pair.
--   ComfyUI (comfy/lora.py model_lora_keys_unet) maps no key of either file
--   for the attention projections: it knows SDXL's diffusers names for them
--   only in the older "unet.<...>.attn1.processor.to_q" form. The other
--   modules (proj_in, ff, resnets) it would map, but at scaling 1.0: it reads
--   alpha only from NAME.alpha tensors, and diffusers' load_lora_weights
--   refuses a file with those (every key must hold "lora"). Use format
--   "kohya" for ComfyUI (and A1111/Forge).

-- lora.peft_name(path): the module's key prefix in diffusers' layout ("unet." .. path);
-- lora.peft_model_name(path): in peft's save_pretrained layout ("base_model.model." .. path).
-- Keys are NAME.lora_A.weight / NAME.lora_B.weight.
function lora.peft_name(path) return "unet." .. path end
function lora.peft_model_name(path) return "base_model.model." .. path end

-- The file keys of an adapter: a list of {key, parameter name} and
-- {key, value = alpha} entries, in kohya's naming (default), diffusers' PEFT
-- naming ("peft") or peft's save_pretrained naming ("peft_model").
function lora.entries(h, format)
  local out = {}
  for _, ad in ipairs(h.adapters) do
    if format == "peft" or format == "peft_model" then
      local name = format == "peft" and lora.peft_name(ad.path) or lora.peft_model_name(ad.path)
      out[#out + 1] = {name .. ".lora_A.weight", ad.down}
      out[#out + 1] = {name .. ".lora_B.weight", ad.up}
    else
      local name = lora.kohya_name(ad.path, h.config)
      out[#out + 1] = {name .. ".lora_down.weight", ad.down}
      out[#out + 1] = {name .. ".lora_up.weight", ad.up}
      out[#out + 1] = {name .. ".alpha", value = ad.alpha}
    end
  end
  return out
end

-- an empty table as a JSON object ({} rather than [])
local function object(t)
  return next(t) == nil and ck.json_object{} or t
end

-- lora.peft_config(h) -> the fields of a peft LoraConfig for the adapter:
-- peft_type "LORA", r = rank, lora_alpha = alpha, target_modules (see
-- lora.attach), rank_pattern and alpha_pattern ({module path = value}) for
-- the modules whose rank or alpha differ (LoCon's 3x3 convolutions at
-- conv_rank/conv_alpha), and plain LoRA: bias "none", no DoRA, no rsLoRA, no
-- lora_bias, no fan_in_fan_out. peft reads a pattern key as a regular
-- expression matched at a path's end after a dot or at its start; a UNet
-- module's full path matches that module only. Dropout is left out: ckrun's
-- acts on lora_down's output, peft's lora_dropout on the input, and neither
-- matters once trained.
function lora.peft_config(h)
  local rank_pattern, alpha_pattern = {}, {}
  for _, ad in ipairs(h.adapters) do
    if ad.rank ~= h.rank then rank_pattern[ad.path] = ad.rank end
    if ad.alpha ~= h.alpha then alpha_pattern[ad.path] = ad.alpha end
  end
  local targets = {}
  for i, t in ipairs(h.peft_targets or h.paths) do targets[i] = t end
  return {
    peft_type = "LORA", r = h.rank, lora_alpha = h.alpha, target_modules = targets,
    rank_pattern = object(rank_pattern), alpha_pattern = object(alpha_pattern),
    bias = "none", fan_in_fan_out = false, lora_bias = false, use_dora = false, use_rslora = false,
  }
end

local JSON = {indent = 2, whole_floats = "integer"}

-- lora_adapter_metadata as diffusers' save_lora_weights writes it: the
-- config's fields under "unet." (prefix) or bare (prefix ""), keys sorted
local function adapter_metadata(cfg, prefix)
  local t = {}
  for k, v in pairs(cfg) do t[prefix .. k] = v end
  return ck.json_encode(t, JSON)
end
-- lora.adapter_metadata(config, prefix): the same text, for other model families' files
lora.adapter_metadata = adapter_metadata

-- writes text to path by way of a temporary file renamed over it
local function write_atomic(path, text)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("lora.save: cannot write " .. path .. ": " .. tostring(err), 3) end
  local ok, werr = f:write(text)
  f:close()
  if not ok then
    os.remove(tmp)
    error("lora.save: cannot write " .. path .. ": " .. tostring(werr), 3)
  end
  local renamed, rerr = os.rename(tmp, path)
  if not renamed then
    os.remove(tmp)
    error("lora.save: cannot write " .. path .. ": " .. tostring(rerr), 3)
  end
end

-- lora.save(program, handle, path, {format = "kohya" | "peft", metadata = {...}, dtype = "F32",
--                                   peft_folder = true})
-- writes the adapter atomically: kohya's file with its ss_* and ModelSpec
-- metadata, or for "peft" the file diffusers loads and, unless peft_folder is
-- false, adapter_config.json and adapter_model.safetensors in path's folder
-- (see "files" above). metadata entries are added to each safetensors file;
-- dtype ("F32", "F16", "BF16") is that of every tensor.
function lora.save(p, h, path, o)
  o = o or {}
  local format = o.format or "kohya"
  local meta = {}
  local folder, cfg
  if format == "kohya" then
    meta = {
      ss_network_module = "networks.lora",
      ss_network_dim = tostring(h.rank),
      ss_network_alpha = tostring(h.alpha),
      ss_base_model_version = "sdxl_base_v1-0",
      ss_v2 = "False",
      ss_network_args = h.conv_rank and string.format('{"conv_dim": "%d", "conv_alpha": "%s"}', h.conv_rank,
        tostring(h.conv_alpha)) or "{}",
      ["modelspec.sai_model_spec"] = "1.0.0",
      ["modelspec.architecture"] = "stable-diffusion-xl-v1-base/lora",
      ["modelspec.implementation"] = "https://github.com/Stability-AI/generative-models",
      ["modelspec.title"] = o.title or "ckrun LoRA",
    }
  elseif format == "peft" then
    cfg = lora.peft_config(h)
    meta = {format = "pt", lora_adapter_metadata = adapter_metadata(cfg, "unet.")}
    if o.peft_folder ~= false then
      local dir, base = path:match("^(.*/)([^/]*)$")
      folder, base = dir or "", base or path
      if base == "adapter_model.safetensors" or base == "adapter_config.json" then
        error(string.format("lora.save: %s: format peft writes adapter_model.safetensors and adapter_config.json "
          .. "beside the file; give the file another name (or peft_folder = false)", path), 2)
      end
    end
  else
    error("unknown LoRA format '" .. tostring(format) .. "' (kohya, peft)", 2)
  end
  if format == "kohya" and h.dropout > 0 then meta.ss_network_dropout = tostring(h.dropout) end
  if format == "kohya" and h.loraplus_lr_ratio ~= 1 then meta.ss_loraplus_lr_ratio = tostring(h.loraplus_lr_ratio) end
  for k, v in pairs(o.metadata or {}) do meta[k] = v end
  p:save(path, lora.entries(h, format), {metadata = meta, dtype = o.dtype})
  if folder then
    local pmeta = {}
    for k, v in pairs(o.metadata or {}) do pmeta[k] = v end
    pmeta.format = "pt"
    pmeta.lora_adapter_metadata = adapter_metadata(cfg, "")
    p:save(folder .. "adapter_model.safetensors", lora.entries(h, "peft_model"), {metadata = pmeta, dtype = o.dtype})
    local c = {inference_mode = true}
    for k, v in pairs(cfg) do c[k] = v end
    write_atomic(folder .. "adapter_config.json", ck.json_encode(c, JSON) .. "\n")
  end
end

-- the rank and alpha a LoraConfig (decoded JSON, fields under prefix) gives
-- module path: its rank_pattern / alpha_pattern entry if one names it (the
-- path itself, "^" .. path, or a tail of the path after a dot), else r / lora_alpha
local function config_rank_alpha(c, prefix, path)
  local function pick(pattern, default)
    if type(pattern) == "table" then
      for k, v in pairs(pattern) do
        if type(k) == "string" and (k == path or k == "^" .. path or path:sub(-#k - 1) == "." .. k) then return v end
      end
    end
    return default
  end
  return pick(c[prefix .. "rank_pattern"], c[prefix .. "r"]), pick(c[prefix .. "alpha_pattern"], c[prefix .. "lora_alpha"])
end
-- lora.config_rank_alpha(config, prefix, path): the same, for other model families' files
lora.config_rank_alpha = config_rank_alpha

-- lora.load(program, handle, path): loads an adapter saved in any of the
-- namings (found from the keys): kohya's, diffusers' PEFT file or peft's
-- adapter_model.safetensors. A missing or misshaped key is an error naming
-- it, and so is an alpha or rank that differs from the handle's: a kohya
-- alpha tensor, or the lora_adapter_metadata of a PEFT file that has it.
-- Returns "kohya", "peft" or "peft_model".
function lora.load(p, h, path)
  local f <close> = ck.safetensors(path)
  local first = h.adapters[1]
  local format = "kohya"
  if first and f:has(lora.peft_name(first.path) .. ".lora_A.weight") then format = "peft" end
  if first and f:has(lora.peft_model_name(first.path) .. ".lora_A.weight") then format = "peft_model" end
  local map = {}
  for _, e in ipairs(lora.entries(h, format)) do
    if e.value then
      if not f:has(e[1]) then error(path .. ": missing tensor '" .. e[1] .. "'", 2) end
      local a = f:read(e[1])[1]
      if math.abs(a - e.value) > 1e-6 * math.max(1, math.abs(a)) then
        error(string.format("%s: '%s' is %g, the adapter has alpha %g", path, e[1], a, e.value), 2)
      end
    else
      map[e[2]] = e[1]
    end
  end
  local raw = format ~= "kohya" and f:metadata().lora_adapter_metadata
  if raw then
    local ok, c = pcall(ck.json_decode, raw)
    if not ok or type(c) ~= "table" then error(path .. ": lora_adapter_metadata is not a JSON object", 2) end
    local prefix = format == "peft" and "unet." or ""
    for _, ad in ipairs(h.adapters) do
      local r, a = config_rank_alpha(c, prefix, ad.path)
      if r ~= ad.rank or a ~= ad.alpha then
        error(string.format("%s: lora_adapter_metadata gives '%s' rank %s alpha %s, the adapter has rank %d alpha %g",
          path, ad.path, tostring(r), tostring(a), ad.rank, ad.alpha), 2)
      end
    end
  end
  p:load(f, map)
  return format
end

return lora
