-- Base models in the forms users have them: a Stability (SGM) single-file
-- SDXL checkpoint or a diffusers folder, described per part (unet, vae,
-- text_encoder, text_encoder_2) as a map from diffusers' parameter names to
-- the file's tensors, and loaded into programs through p:load by that map.
-- The single-file names map to diffusers' by rules built from the UNet's
-- config (its blocks), not from a list of names.
--
--   local d = checkpoint.open("sd_xl_base_1.0.safetensors") -- or a diffusers folder
--   local cfg = checkpoint.unet_config(d.unet_config or unet.config("sdxl"))
--   local model, y = unet.build(g, unet.UNet2DConditionModel(cfg), {frozen = true})
--   local p = g:compile{...}
--   local base = {}
--   for _, t in ipairs(g:params()) do if t.kind == "frozen" then base[#base + 1] = t end end
--   checkpoint.load(p, "unet", d.unet, base)
local ck = require "ck"

local checkpoint = {}

local errors = require "ck.errors"
local fail, public, shape_str, same_shape = errors.fail, errors.public, errors.shape_str, errors.same_shape

local function split(s)
  local t = {}
  for part in s:gmatch("[^.]+") do t[#t + 1] = part end
  return t
end

local function per_block(v, n)
  if type(v) ~= "table" then
    local t = {}
    for i = 1, n do t[i] = v end
    return t
  end
  return v
end

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then fail("%s", err) end
  local text = f:read("a")
  f:close()
  local ok, v = pcall(ck.json_decode, text)
  if not ok or type(v) ~= "table" then fail("%s: not a JSON object: %s", path, tostring(v)) end
  return v
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

---- diffusers' unet/config.json -> ck.unet's config

local down_types = {DownBlock2D = true, CrossAttnDownBlock2D = true}
local up_types = {UpBlock2D = true, CrossAttnUpBlock2D = true}

-- the keys ck.unet builds from; every other key of a diffusers config must
-- hold its default (what ck.unet builds), or the model is not this one
local used = {
  "_class_name", "sample_size", "in_channels", "out_channels", "flip_sin_to_cos", "freq_shift", "down_block_types",
  "mid_block_type", "up_block_types", "block_out_channels", "layers_per_block", "downsample_padding", "act_fn",
  "norm_num_groups", "norm_eps", "cross_attention_dim", "transformer_layers_per_block", "attention_head_dim",
  "num_attention_heads", "use_linear_projection", "addition_embed_type", "addition_time_embed_dim",
  "projection_class_embeddings_input_dim", "dropout",
}
local defaults = {
  class_embed_type = "null", encoder_hid_dim_type = "null", num_class_embeds = "null", time_cond_proj_dim = "null",
  reverse_transformer_layers_per_block = "null", time_embedding_dim = "null", time_embedding_act_fn = "null",
  timestep_post_act = "null", time_embedding_type = "positional", resnet_time_scale_shift = "default",
  attention_type = "default", conv_in_kernel = 3, conv_out_kernel = 3, dual_cross_attention = false,
  only_cross_attention = false, resnet_skip_time_act = false, resnet_out_scale_factor = 1,
  mid_block_scale_factor = 1, center_input_sample = false, class_embeddings_concat = false,
}

local function is_null(v) return v == nil or v == ck.json_null end

local copy = require("ck.nn").copy

local function unet_config(tbl, file)
  file = file or "unet config"
  if type(tbl) ~= "table" then fail("%s: a UNet config is a table, got %s", file, type(tbl)) end
  local c = {}
  for _, k in ipairs(used) do
    local v = rawget(tbl, k)
    if not is_null(v) then c[k] = copy(v) end
  end
  for k, want in pairs(defaults) do
    local v = rawget(tbl, k)
    local ok
    if want == "null" then ok = is_null(v)
    elseif type(v) == "table" then -- a per-block list, each its default
      ok = true
      for _, x in ipairs(v) do ok = ok and x == want end
    else ok = is_null(v) or v == want end
    if not ok then
      fail("%s: key '%s' is %s; ck.unet builds only %s", file, k,
        type(v) == "table" and ck.json_encode(v) or tostring(v), want == "null" and "null" or tostring(want))
    end
  end
  if c._class_name and c._class_name ~= "UNet2DConditionModel" then
    fail("%s: key '_class_name' is %s; ck.unet builds UNet2DConditionModel", file, tostring(c._class_name))
  end
  for _, k in ipairs{"block_out_channels", "down_block_types", "up_block_types"} do
    if type(c[k]) ~= "table" or #c[k] == 0 then fail("%s: key '%s' must be a list", file, k) end
  end
  local n = #c.block_out_channels
  for _, k in ipairs{"in_channels", "out_channels", "cross_attention_dim"} do
    if math.type(c[k]) ~= "integer" then fail("%s: key '%s' must be an integer", file, k) end
  end
  for i, t in ipairs(c.down_block_types) do
    if not down_types[t] then fail("%s: key 'down_block_types' entry %d is %s, a block ck.unet lacks "
      .. "(DownBlock2D, CrossAttnDownBlock2D)", file, i, tostring(t)) end
  end
  for i, t in ipairs(c.up_block_types) do
    if not up_types[t] then fail("%s: key 'up_block_types' entry %d is %s, a block ck.unet lacks "
      .. "(UpBlock2D, CrossAttnUpBlock2D)", file, i, tostring(t)) end
  end
  if #c.down_block_types ~= n or #c.up_block_types ~= n then
    fail("%s: keys 'down_block_types' and 'up_block_types' must list %d blocks, as block_out_channels", file, n)
  end
  if c.mid_block_type ~= nil and c.mid_block_type ~= "UNetMidBlock2DCrossAttn" then
    fail("%s: key 'mid_block_type' is %s, a block ck.unet lacks (UNetMidBlock2DCrossAttn)", file,
      tostring(c.mid_block_type))
  end
  if c.act_fn ~= nil and c.act_fn ~= "silu" then
    fail("%s: key 'act_fn' is %s; ck.unet builds silu", file, tostring(c.act_fn))
  end
  if c.addition_embed_type ~= nil and c.addition_embed_type ~= "text_time" then
    fail("%s: key 'addition_embed_type' is %s; ck.unet builds text_time or none", file,
      tostring(c.addition_embed_type))
  end
  local why = require("ck.unet").check_config(c)
  if why then fail("%s: %s", file, why) end
  return c
end

-- checkpoint.unet_config(tbl [, file]) -> a config for ck.unet (a fresh table)
-- from a diffusers unet/config.json table (or a ck.unet config): JSON nulls
-- dropped; block types ck.unet lacks, and keys that would change the model
-- from what ck.unet builds, refused with one line naming the file and the key.
checkpoint.unet_config = public(unet_config)

---- SGM (LDM) names -> diffusers names

local sdxl_config = {
  block_out_channels = {320, 640, 1280}, layers_per_block = 2, in_channels = 4,
  down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"},
  up_block_types = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"},
  addition_embed_type = "text_time", projection_class_embeddings_input_dim = 2816,
}

-- the UNet's SGM module prefixes -> {diffusers prefix, resnet = true when the
-- LDM ResBlock's inner names need renaming}, block by block from the config
local function unet_prefixes(c)
  local n = #c.block_out_channels
  local layers = per_block(c.layers_per_block or 2, n)
  local m = {
    ["input_blocks.0.0"] = {"conv_in"}, ["time_embed.0"] = {"time_embedding.linear_1"},
    ["time_embed.2"] = {"time_embedding.linear_2"}, ["out.0"] = {"conv_norm_out"}, ["out.2"] = {"conv_out"},
    ["middle_block.0"] = {"mid_block.resnets.0", resnet = true}, ["middle_block.1"] = {"mid_block.attentions.0"},
    ["middle_block.2"] = {"mid_block.resnets.1", resnet = true},
  }
  if c.addition_embed_type == "text_time" then
    m["label_emb.0.0"] = {"add_embedding.linear_1"}
    m["label_emb.0.2"] = {"add_embedding.linear_2"}
  end
  -- input_blocks: after conv_in, each level's resnets (each with its
  -- attention beside it at .1), then its downsampler (all but the last)
  local k = 1
  for b = 0, n - 1 do
    local cross = c.down_block_types[b + 1] == "CrossAttnDownBlock2D"
    for j = 0, layers[b + 1] - 1 do
      m["input_blocks." .. k .. ".0"] = {"down_blocks." .. b .. ".resnets." .. j, resnet = true}
      if cross then m["input_blocks." .. k .. ".1"] = {"down_blocks." .. b .. ".attentions." .. j} end
      k = k + 1
    end
    if b < n - 1 then
      m["input_blocks." .. k .. ".0.op"] = {"down_blocks." .. b .. ".downsamplers.0.conv"}
      k = k + 1
    end
  end
  -- output_blocks: the levels in reverse, one more resnet each; the upsampler
  -- sits after the last resnet (and its attention, when it has one)
  k = 0
  for b = 0, n - 1 do
    local cross = c.up_block_types[b + 1] == "CrossAttnUpBlock2D"
    local l = layers[n - b] + 1
    for j = 0, l - 1 do
      m["output_blocks." .. k .. ".0"] = {"up_blocks." .. b .. ".resnets." .. j, resnet = true}
      if cross then m["output_blocks." .. k .. ".1"] = {"up_blocks." .. b .. ".attentions." .. j} end
      if b < n - 1 and j == l - 1 then
        m["output_blocks." .. k .. "." .. (cross and 2 or 1) .. ".conv"] = {"up_blocks." .. b .. ".upsamplers.0.conv"}
      end
      k = k + 1
    end
  end
  return m
end

-- the LDM ResBlock's inner modules -> ResnetBlock2D's
local resnet_inner = {
  ["in_layers.0"] = "norm1", ["in_layers.2"] = "conv1", ["emb_layers.1"] = "time_emb_proj",
  ["out_layers.0"] = "norm2", ["out_layers.3"] = "conv2",
}

-- an SGM UNet key (without model.diffusion_model.) -> its diffusers name, or nil
local function unet_name(prefixes, key)
  local parts = split(key)
  for cut = #parts - 1, 1, -1 do
    local e = prefixes[table.concat(parts, ".", 1, cut)]
    if e then
      local rest = {table.unpack(parts, cut + 1)}
      if e.resnet then
        local two = #rest >= 3 and resnet_inner[rest[1] .. "." .. rest[2]]
        if two then
          rest = {two, table.unpack(rest, 3)}
        elseif rest[1] == "skip_connection" and #rest == 2 then
          rest = {"conv_shortcut", rest[2]}
        else
          return nil
        end
      end
      return e[1] .. "." .. table.concat(rest, ".")
    end
  end
  return nil
end

local vae_resnet_inner = {norm1 = true, conv1 = true, norm2 = true, conv2 = true, nin_shortcut = "conv_shortcut"}
local vae_attn_inner = {norm = "group_norm", q = "to_q", k = "to_k", v = "to_v", proj_out = "to_out.0"}
local vae_plain = {
  ["encoder.conv_in"] = true, ["encoder.conv_out"] = true, ["decoder.conv_in"] = true, ["decoder.conv_out"] = true,
  ["quant_conv"] = true, ["post_quant_conv"] = true,
  ["encoder.norm_out"] = "encoder.conv_norm_out", ["decoder.norm_out"] = "decoder.conv_norm_out",
}

local function resnet_rest(module, wb)
  local r = vae_resnet_inner[module]
  if not r or (wb ~= "weight" and wb ~= "bias") then return nil end
  return (r == true and module or r) .. "." .. wb
end

-- an LDM VAE key (without first_stage_model.) -> diffusers name, reshape?; nil
-- when it does not map. n: the number of levels (the decoder's are reversed).
local function vae_name(key, n, shape)
  local mod, wb = key:match("^(.*)%.([%w_]+)$")
  if not mod then return nil end
  local plain = vae_plain[mod]
  if plain then return (plain == true and mod or plain) .. "." .. wb end
  local i, j, inner = key:match("^encoder%.down%.(%d+)%.block%.(%d+)%.([%w_]+)%.[%w_]+$")
  if i then
    local r = resnet_rest(inner, wb)
    return r and string.format("encoder.down_blocks.%s.resnets.%s.%s", i, j, r)
  end
  i = key:match("^encoder%.down%.(%d+)%.downsample%.conv%.[%w_]+$")
  if i then return string.format("encoder.down_blocks.%s.downsamplers.0.conv.%s", i, wb) end
  i, j, inner = key:match("^decoder%.up%.(%d+)%.block%.(%d+)%.([%w_]+)%.[%w_]+$")
  if i then
    local r = resnet_rest(inner, wb)
    return r and string.format("decoder.up_blocks.%d.resnets.%s.%s", n - 1 - tonumber(i), j, r)
  end
  i = key:match("^decoder%.up%.(%d+)%.upsample%.conv%.[%w_]+$")
  if i then return string.format("decoder.up_blocks.%d.upsamplers.0.conv.%s", n - 1 - tonumber(i), wb) end
  local coder, k
  coder, k, inner = key:match("^(%a+coder)%.mid%.block_(%d)%.([%w_]+)%.[%w_]+$")
  if coder and tonumber(k) >= 1 then
    local r = resnet_rest(inner, wb)
    return r and string.format("%s.mid_block.resnets.%d.%s", coder, tonumber(k) - 1, r)
  end
  coder, inner = key:match("^(%a+coder)%.mid%.attn_1%.([%w_]+)%.[%w_]+$")
  if coder and vae_attn_inner[inner] and (wb == "weight" or wb == "bias") then
    -- the LDM attention's q, k, v and proj_out are 1x1 convs: [C, C, 1, 1] into Linear [C, C]
    return string.format("%s.mid_block.attentions.0.%s.%s", coder, vae_attn_inner[inner], wb), #shape > 2
  end
  return nil
end

-- checkpoint.vae_name(key, levels, shape) -> the diffusers name of an LDM
-- VAE key without its prefix (what Black Forest Labs' ae.safetensors holds)
-- and whether the tensor is a 1x1 conv read as a Linear; nil when it does not map
checkpoint.vae_name = vae_name

local open_clip_fixed = {
  positional_embedding = "text_model.embeddings.position_embedding.weight",
  ["token_embedding.weight"] = "text_model.embeddings.token_embedding.weight",
  ["ln_final.weight"] = "text_model.final_layer_norm.weight",
  ["ln_final.bias"] = "text_model.final_layer_norm.bias",
}
local open_clip_inner = {
  ["ln_1"] = "layer_norm1", ["ln_2"] = "layer_norm2", ["mlp.c_fc"] = "mlp.fc1", ["mlp.c_proj"] = "mlp.fc2",
  ["attn.out_proj"] = "self_attn.out_proj",
}

-- adds OpenCLIP key (without conditioner.embedders.1.model.) to map as
-- CLIPTextModelWithProjection's names; false when it does not map
local function open_clip_add(map, full, key, shape, path)
  if key == "logit_scale" then return true end -- the contrastive scale: no text-model parameter
  if open_clip_fixed[key] then
    map[open_clip_fixed[key]] = full
    return true
  end
  if key == "text_projection" then -- OpenCLIP multiplies x @ P; a Linear holds P transposed
    map["text_projection.weight"] = {key = full, transpose = true}
    return true
  end
  local i, rest = key:match("^transformer%.resblocks%.(%d+)%.(.+)$")
  if not i then return false end
  local layer = "text_model.encoder.layers." .. i .. "."
  local kind = rest:match("^attn%.in_proj_(%a+)$")
  if kind == "weight" or kind == "bias" then -- q, k and v fused by rows
    if #shape < 1 or shape[1] % 3 ~= 0 then
      fail("%s: tensor '%s' has shape %s: q, k and v fused need rows a multiple of 3", path, full, shape_str(shape))
    end
    local h = shape[1] // 3
    for n, qkv in ipairs{"q", "k", "v"} do
      map[layer .. "self_attn." .. qkv .. "_proj." .. kind] = {key = full, rows = {1 + (n - 1) * h, h}}
    end
    return true
  end
  local mod, wb = rest:match("^(.*)%.([%w_]+)$")
  if mod and open_clip_inner[mod] and (wb == "weight" or wb == "bias") then
    map[layer .. open_clip_inner[mod] .. "." .. wb] = full
    return true
  end
  return false
end

---- what a part's architecture holds

-- the parameter names of ck.nn module trees (Linear, Conv2d, GroupNorm,
-- LayerNorm and embedding tables declare all of ck's parameters): a set
local function param_names(roots)
  local nn = require "ck.nn"
  local names = {}
  for _, root in ipairs(roots) do
    for _, e in ipairs(root:named_modules("")) do
      local m, p = e[2], e[1] == "" and "" or e[1] .. "."
      local mt = getmetatable(m)
      if mt == nn.Linear or mt == nn.Conv2d then
        names[p .. "weight"] = true
        if m.bias then names[p .. "bias"] = true end
      elseif mt == nn.GroupNorm or mt == nn.LayerNorm then
        names[p .. "weight"], names[p .. "bias"] = true, true
      elseif m:type() == "nn.CLIPEmbedding" then
        names[p .. "weight"] = true
      end
    end
  end
  return names
end

-- the whole architecture of a part by its config (every layer, the final
-- norm, the projection of text_encoder_2: what the file may hold, not what a
-- program builds of it); a named config's set is made once
local named_sets = {}
local function architecture(part, config)
  if type(config) == "string" then
    local key = part .. " " .. config
    named_sets[key] = named_sets[key] or architecture(part, require(part == "unet" and "ck.unet" or part == "vae" and
      "ck.vae" or "ck.clip").config(config))
    return named_sets[key]
  end
  if part == "unet" then
    return param_names{require("ck.unet").UNet2DConditionModel(config)}
  elseif part == "vae" then
    local vae = require "ck.vae"
    local c = vae.config(config)
    return param_names{vae.EncoderPart(c), vae.DecoderPart(c)}
  end
  local clip = require "ck.clip"
  local c = clip.config(config)
  return param_names{clip.CLIPTextEncoder(c, {layers = c.num_hidden_layers, final = true,
                                              projection = part == "text_encoder_2"})}
end

-- buffers transformers saves beside the parameters: nothing to load
local BUFFERS = {["text_model.embeddings.position_ids"] = true}

-- Every name of a part's map is a parameter of its architecture, or the key
-- is refused naming the file: a key no rule maps and one mapped to a name the
-- model lacks (a block index past the config's, an inner name of no module)
-- are both unknown keys, never skipped. key_of(name) -> the file's key.
local function check_names(part, map, config, file, key_of)
  local ok, names = pcall(architecture, part, config)
  if not ok then fail("%s: %s config: %s", file, part, tostring(type(names) == "table" and names.msg or names):gsub("^[^:]*:%d+: ", "")) end
  local bad
  for name in pairs(map) do
    if not names[name] and (not bad or name < bad) then bad = name end
  end
  if bad then
    fail("%s: tensor '%s' maps to '%s', which the %s does not have%s", file, key_of(bad), bad, part,
      part == "unet" and " (with this UNet's config)" or "")
  end
end

-- checkpoint.parameter_names(part, config) -> the set of parameter names
-- of a part ("unet", "vae", "text_encoder", "text_encoder_2") of that config
-- (a table, or a name as unet.config, vae.config and clip.config take): what
-- a checkpoint's keys must map to
checkpoint.parameter_names = public(function(part, config) 
  local set = {}
  for k in pairs(architecture(part, config)) do set[k] = true end
  return set
end)

local UNET, VAE = "model.diffusion_model.", "first_stage_model."
local CLIP_L, CLIP_G = "conditioner.embedders.0.transformer.", "conditioner.embedders.1.model."

local function starts(s, p) return s:sub(1, #p) == p end

---- what a file is

-- an SDXL file's telling tensors, with and without SGM's prefix
local SDXL_KEYS = {"model.diffusion_model.input_blocks.0.0.weight", "conv_in.weight", "down_blocks.0.resnets.0.conv1.weight"}

-- checkpoint.kind(keys_set) -> "bfl" | "diffusers" | "sdxl" | nil, prefix, the telling key:
-- what a set of tensor names ({name = true}) holds: a Flux transformer in
-- Black Forest Labs' names or diffusers', or an SDXL model (the transformer's
-- names also under SGM's prefix, as ComfyUI's single files hold them)
function checkpoint.kind(has)
  for _, p in ipairs{"", UNET} do
    if has[p .. "img_in.weight"] or has[p .. "double_blocks.0.img_attn.qkv.weight"] then
      return "bfl", p, p .. (has[p .. "img_in.weight"] and "img_in.weight" or "double_blocks.0.img_attn.qkv.weight")
    end
    if has[p .. "x_embedder.weight"] then return "diffusers", p, p .. "x_embedder.weight" end
  end
  for _, k in ipairs(SDXL_KEYS) do if has[k] then return "sdxl", "", k end end
  return nil
end

local function open_single(path, opts)
  local f <close> = ck.safetensors(path)
  local keys = f:keys()
  local has = {}
  for _, k in ipairs(keys) do has[k] = true end
  local flux_kind, _, flux_key = checkpoint.kind(has)
  if flux_kind == "bfl" or flux_kind == "diffusers" then
    fail("%s: a Flux transformer (tensor '%s'), not an SDXL checkpoint; Flux trains with ck.flux", path, flux_key)
  end
  local nunet, vae_levels = 0, 0
  for _, k in ipairs(keys) do
    if starts(k, UNET) then nunet = nunet + 1 end
    local lv = k:match("^first_stage_model%.encoder%.down%.(%d+)%.")
      or k:match("^first_stage_model%.decoder%.up%.(%d+)%.")
    if lv then vae_levels = math.max(vae_levels, tonumber(lv) + 1) end
  end
  if nunet == 0 then
    fail("%s: not an SDXL checkpoint: no model.diffusion_model.* tensors%s", path,
      f:has("conv_in.weight") and " (a UNet in diffusers' names loads with p:load by name)" or "")
  end
  local given = opts.unet_config
  if type(given) == "string" then given = require("ck.unet").config(given) end
  local c = given and unet_config(given, path) or sdxl_config
  -- the tensors that tell SDXL's UNet from others: its first conv, and the
  -- text_time embedding (SD 1.x and 2.x have none)
  local boc1 = c.block_out_channels[1]
  local ident = {{"input_blocks.0.0.weight", {boc1, c.in_channels, 3, 3}}}
  if c.addition_embed_type == "text_time" then
    ident[2] = {"label_emb.0.0.weight", {boc1 * 4, c.projection_class_embeddings_input_dim}}
  end
  for _, e in ipairs(ident) do
    local key = UNET .. e[1]
    if not f:has(key) then fail("%s: not an SDXL checkpoint: no tensor '%s'", path, key) end
    local s = f:shape(key)
    if not same_shape(s, e[2]) then
      fail("%s: not an SDXL checkpoint: tensor '%s' has shape %s, %s has %s", path, key, shape_str(s),
        given and "the given UNet config" or "SDXL base", shape_str(e[2]))
    end
  end
  local prefixes = unet_prefixes(c)
  local parts = {}
  local function part(name)
    parts[name] = parts[name] or {file = path, map = {}}
    return parts[name].map
  end
  local function unmapped(k)
    fail("%s: tensor '%s' does not map to a diffusers name%s", path, k,
      starts(k, UNET) and " of this UNet's config" or "")
  end
  for _, k in ipairs(keys) do
    if starts(k, UNET) then
      local name = unet_name(prefixes, k:sub(#UNET + 1))
      if not name then unmapped(k) end
      part("unet")[name] = k
    elseif starts(k, VAE) then
      local name, reshape = vae_name(k:sub(#VAE + 1), vae_levels, f:shape(k))
      if not name then unmapped(k) end
      part("vae")[name] = reshape and {key = k, reshape = true} or k
    elseif starts(k, CLIP_L) then
      local rest = k:sub(#CLIP_L + 1)
      if not starts(rest, "text_model.") then unmapped(k) end
      if not BUFFERS[rest] then part("text_encoder")[rest] = k end -- a buffer, not a parameter
    elseif starts(k, CLIP_G) then
      if not open_clip_add(part("text_encoder_2"), k, k:sub(#CLIP_G + 1), f:shape(k), path) then unmapped(k) end
    end
  end
  -- every mapped name a parameter of SDXL's parts (the UNet's by its config)
  local configs = {unet = given and c or "sdxl", vae = "sdxl", text_encoder = "sdxl-l", text_encoder_2 = "sdxl-g"}
  for name, p in pairs(parts) do
    check_names(name, p.map, configs[name], path, function(n)
      local src = p.map[n]
      return type(src) == "table" and src.key or src
    end)
  end
  local d = {kind = "single", file = path, unet_config = opts.unet_config}
  for name, p in pairs(parts) do d[name] = p end
  return d
end

-- a part's weights in a diffusers folder: the file (or the shards of an
-- index) by the names diffusers and transformers save under
local function folder_part(dir, stem, variant)
  local names = {stem .. ".safetensors", stem .. ".fp16.safetensors"}
  if variant == "fp16" then names = {names[2], names[1]} end
  for _, n in ipairs(names) do
    local file = dir .. "/" .. n
    if exists(file) then
      local f <close> = ck.safetensors(file)
      local map = {}
      for _, k in ipairs(f:keys()) do map[k] = k end
      return {file = file, map = map}
    end
  end
  for _, n in ipairs(names) do
    local index = dir .. "/" .. n .. ".index.json"
    if exists(index) then
      local wm = rawget(read_json(index), "weight_map")
      if type(wm) ~= "table" then fail("%s: no weight_map object", index) end
      local map, files, seen = {}, {}, {}
      for k, shard in pairs(wm) do
        if type(k) ~= "string" or type(shard) ~= "string" or shard:find("/", 1, true) or shard:find("..", 1, true) then
          fail("%s: weight_map entry '%s' must name a file of this folder", index, tostring(k))
        end
        local file = dir .. "/" .. shard
        if not seen[file] then
          seen[file] = true
          files[#files + 1] = file
        end
        map[k] = {key = k, file = file}
      end
      table.sort(files)
      -- every shard opens, and holds what the index says it holds
      for _, file in ipairs(files) do
        local f <close> = ck.safetensors(file)
        for k, src in pairs(map) do
          if src.file == file and not f:has(k) then fail("%s: missing tensor '%s' (named by %s)", file, k, index) end
        end
      end
      return {file = index, files = files, map = map}
    end
  end
  fail("%s: no weights (%s, or a sharded .index.json)", dir, table.concat(names, ", "))
end

-- a folder's VAE or text encoder config, checked as ck.vae and ck.clip read
-- it (type, sign, range), and a text encoder's token ids inside its vocabulary
local function check_config(name, config, file)
  local function unplaced(e) return (tostring(type(e) == "table" and e.msg or e):gsub("^[^:]*:%d+: ", "")) end
  if name == "vae" then
    local ok, e = pcall(require("ck.vae").config, config)
    if not ok then fail("%s: %s", file, unplaced(e)) end
    return
  end
  local ok, c = pcall(require("ck.clip").config, config)
  if not ok then fail("%s: %s", file, unplaced(c)) end
  for _, k in ipairs{"bos_token_id", "eos_token_id", "pad_token_id"} do
    local v = rawget(config, k)
    if v ~= nil and v ~= ck.json_null and not (math.type(v) == "integer" and v >= 0 and v < c.vocab_size) then
      fail("%s: key '%s' is %s, not a token id of the %d-entry vocabulary", file, k, tostring(v), c.vocab_size)
    end
  end
end

-- checkpoint.folder_weights(dir, stem [, variant]) -> {file, map (name -> key or
-- {key =, file =}), files}: a diffusers part's weights (stem.safetensors, its
-- fp16 variant, or the shards of stem.safetensors.index.json), each shard
-- opened and checked to hold what the index names (ck.flux_keys reads a
-- Flux transformer/ folder with it)
checkpoint.folder_weights = public(folder_part)

local function open_folder(path, opts)
  local d = {kind = "diffusers", file = path}
  local parts = {unet = "diffusion_pytorch_model", vae = "diffusion_pytorch_model",
                 text_encoder = "model", text_encoder_2 = "model"}
  for _, name in ipairs{"unet", "vae", "text_encoder", "text_encoder_2"} do
    local dir = path .. "/" .. name
    if exists(dir .. "/config.json") then
      d[name .. "_config"] = read_json(dir .. "/config.json")
      d[name] = folder_part(dir, parts[name], opts.variant)
      -- the config by type, sign and range (naming its file), then every
      -- tensor of the folder's weights a parameter of its architecture
      local config = d[name .. "_config"]
      if name == "unet" then config = unet_config(config, dir .. "/config.json")
      else check_config(name, config, dir .. "/config.json") end
      for k in pairs(d[name].map) do if BUFFERS[k] then d[name].map[k] = nil end end
      check_names(name, d[name].map, config, d[name].file, function(n) return n end)
    elseif name == "unet" then
      if exists(path .. "/transformer/config.json") then
        fail("%s: a diffusers Flux folder (transformer/config.json), not SDXL; Flux trains with ck.flux", path)
      end
      fail("%s: not a diffusers SDXL folder: no unet/config.json", path)
    end
  end
  for _, name in ipairs{"tokenizer", "tokenizer_2"} do
    if ck.listdir(path .. "/" .. name) then d[name] = path .. "/" .. name end
  end
  return d
end

-- checkpoint.open(path [, {unet_config = tbl | name, variant = "fp16"}]) -> a model
-- description {kind = "single" | "diffusers", unet = {file =, map =}, vae =,
-- text_encoder =, text_encoder_2 =, unet_config =, vae_config =,
-- text_encoder_config =, text_encoder_2_config =, tokenizer = dir,
-- tokenizer_2 = dir}. map: diffusers parameter name -> a key of the file, or
-- {key =, rows = {first, count}} | {key =, transpose = true} | {key =,
-- reshape = true} (p:load's sources); a shard's sources also name their file.
-- A single file's UNet is mapped for opts.unet_config (default: SDXL base's);
-- its unet_config is that option (nil: the sdxl config). A folder's configs
-- are its parsed config.json files; variant = "fp16" prefers *.fp16.safetensors.
checkpoint.open = public(function(path, opts)
  if type(path) ~= "string" then fail("checkpoint.open: path must be a string, got %s", type(path)) end
  opts = opts or {}
  if ck.listdir(path) then return open_folder(path, opts) end
  return open_single(path, opts)
end)

-- checkpoint.load(p, part, desc_part, params) -> count: loads each of params
-- (tensors or names: the base's parameters of one part, e.g. the frozen ones)
-- from desc_part (checkpoint.open's desc.unet, desc.vae, ...) through p:load.
-- A parameter the map has no source for, a source missing from its file, and
-- a shape that differs are each refused with one line naming the key and the
-- file; every parameter's source is found in the map before any loads.
checkpoint.load = public(function(p, part, desc_part, params)
  if type(desc_part) ~= "table" or type(rawget(desc_part, "map")) ~= "table" then
    fail("checkpoint.load: no %s in this model description", tostring(part))
  end
  local by_file, order = {}, {}
  for _, t in ipairs(params) do
    local name = type(t) == "string" and t or t.name
    local src = desc_part.map[name]
    if src == nil then
      fail("%s: no tensor maps to %s parameter '%s'", desc_part.file, tostring(part), name)
    end
    local file = desc_part.file
    if type(src) == "table" then
      file = src.file or file
      if src.file then
        local s = {}
        for k, v in pairs(src) do if k ~= "file" then s[k] = v end end
        src = s
      end
    end
    if not by_file[file] then
      by_file[file] = {}
      order[#order + 1] = file
    end
    by_file[file][name] = src
  end
  local n = 0
  for _, file in ipairs(order) do
    local f <close> = ck.safetensors(file)
    p:load(f, by_file[file])
    for _ in pairs(by_file[file]) do n = n + 1 end
  end
  return n
end)

return checkpoint
