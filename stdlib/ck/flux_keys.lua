-- Flux.1 transformer weights in the forms users have them, mapped onto ck.flux's
-- (diffusers') parameter names: Black Forest Labs' single file (flux1-dev.safetensors,
-- with or without ComfyUI's model.diffusion_model. prefix; bf16 or fp8 e4m3), a
-- diffusers folder (transformer/config.json with one or sharded safetensors) or a
-- single file in diffusers' names. Keys map by rule: qkv split in three, linear1 in
-- four, the final adaLN's halves swapped; every key maps or the file is refused
-- in one line naming it.
--
--   local d = flux_keys.open("flux1-dev.safetensors")      -- or a diffusers folder
--   local model, y, x = flux.build(g, d.config, {frozen = true, ...})
--   local p = g:compile{...}
--   flux_keys.load(p, d, base_params)                      -- the frozen parameters
local ck = require "ck"
local checkpoint = require "ck.checkpoint"

local M = {}

local errors = require "ck.errors"
local fail, public, shape_str, same_shape = errors.fail, errors.public, errors.shape_str, errors.same_shape

local function starts(s, p) return s:sub(1, #p) == p end

-- the error of a ck.flux call as one line without its own position
local function unplaced(e) return (tostring(type(e) == "table" and e.msg or e):gsub("^[^:]*:%d+: ", "")) end

M.PREFIX = "model.diffusion_model."

-- img_in widths of the Flux.1 variants ck.flux does not build
local VARIANTS = {[384] = "FLUX.1 Fill", [128] = "FLUX.1 Canny or Depth"}

---- Black Forest Labs' names -> diffusers'

-- modules renamed whole (weight and bias)
local GLOBAL = {
  img_in = "x_embedder", txt_in = "context_embedder",
  ["time_in.in_layer"] = "time_text_embed.timestep_embedder.linear_1",
  ["time_in.out_layer"] = "time_text_embed.timestep_embedder.linear_2",
  ["vector_in.in_layer"] = "time_text_embed.text_embedder.linear_1",
  ["vector_in.out_layer"] = "time_text_embed.text_embedder.linear_2",
  ["guidance_in.in_layer"] = "time_text_embed.guidance_embedder.linear_1",
  ["guidance_in.out_layer"] = "time_text_embed.guidance_embedder.linear_2",
  ["final_layer.linear"] = "proj_out",
}
local DOUBLE = {
  ["img_mod.lin"] = "norm1.linear", ["txt_mod.lin"] = "norm1_context.linear",
  ["img_attn.proj"] = "attn.to_out.0", ["txt_attn.proj"] = "attn.to_add_out",
  ["img_mlp.0"] = "ff.net.0.proj", ["img_mlp.2"] = "ff.net.2",
  ["txt_mlp.0"] = "ff_context.net.0.proj", ["txt_mlp.2"] = "ff_context.net.2",
}
local DOUBLE_NORMS = {
  ["img_attn.norm.query_norm.scale"] = "attn.norm_q.weight", ["img_attn.norm.key_norm.scale"] = "attn.norm_k.weight",
  ["txt_attn.norm.query_norm.scale"] = "attn.norm_added_q.weight",
  ["txt_attn.norm.key_norm.scale"] = "attn.norm_added_k.weight",
}
local SINGLE = {["modulation.lin"] = "norm.linear", linear2 = "proj_out"}
local SINGLE_NORMS = {["norm.query_norm.scale"] = "attn.norm_q.weight", ["norm.key_norm.scale"] = "attn.norm_k.weight"}
-- fused projections: the diffusers modules their rows hold, in order (widths
-- in units of the model's width; the single block's MLP is 4 wide)
local FUSED_DOUBLE = {
  ["img_attn.qkv"] = {{"attn.to_q", 1}, {"attn.to_k", 1}, {"attn.to_v", 1}},
  ["txt_attn.qkv"] = {{"attn.add_q_proj", 1}, {"attn.add_k_proj", 1}, {"attn.add_v_proj", 1}},
}
local FUSED_SINGLE = {linear1 = {{"attn.to_q", 1}, {"attn.to_k", 1}, {"attn.to_v", 1}, {"proj_mlp", 4}}}

-- M.bfl_sources(key, d) -> a list of {name, source} for one BFL key (no
-- prefix), or nil when no rule maps it. d: the model's width. A source is
-- the key, {key =, rows = {first, count}} or a list of such pieces (p:load's).
function M.bfl_sources(key, d)
  local mod, wb = key:match("^(.*)%.(%w+)$")
  if not mod then return nil end
  local plain = (wb == "weight" or wb == "bias")
  if plain and GLOBAL[mod] then return {{GLOBAL[mod] .. "." .. wb, key}} end
  if mod == "final_layer.adaLN_modulation.1" and plain then -- BFL (shift, scale) -> diffusers (scale, shift)
    return {{"norm_out.linear." .. wb, {{key = key, rows = {d + 1, d}}, {key = key, rows = {1, d}}}}}
  end
  local i, rest = key:match("^double_blocks%.(%d+)%.(.+)$")
  local blk, renamed, norms, fused = "transformer_blocks.", DOUBLE, DOUBLE_NORMS, FUSED_DOUBLE
  if not i then
    i, rest = key:match("^single_blocks%.(%d+)%.(.+)$")
    blk, renamed, norms, fused = "single_transformer_blocks.", SINGLE, SINGLE_NORMS, FUSED_SINGLE
  end
  if not i or (#i > 1 and i:sub(1, 1) == "0") then return nil end
  local prefix = blk .. i .. "."
  if norms[rest] then return {{prefix .. norms[rest], key}} end
  mod = rest:match("^(.*)%.%w+$")
  if not plain then return nil end
  if renamed[mod] then return {{prefix .. renamed[mod] .. "." .. wb, key}} end
  if fused[mod] then
    local out, first = {}, 1
    for _, part in ipairs(fused[mod]) do
      local n = part[2] * d
      out[#out + 1] = {prefix .. part[1] .. "." .. wb, {key = key, rows = {first, n}}}
      first = first + n
    end
    return out
  end
  return nil
end

-- the shape a BFL key must have, from the diffusers shapes it is made of
local function bfl_shape(entries, shapes)
  local first = shapes[entries[1][1]]
  if not first then return nil end
  local s = {table.unpack(first)}
  if type(entries[1][2]) == "table" then -- rows of one key: the entries' rows summed
    local n = 0
    for _, e in ipairs(entries) do
      local sh = shapes[e[1]]
      if not sh then return nil end
      n = n + sh[1]
    end
    s[1] = n
  end
  return s
end

---- what a file is

-- M.kind(keys_set) -> "bfl" | "diffusers" | "sdxl" | nil, prefix, the telling
-- key: what a set of tensor names ({name = true}) holds (ck.checkpoint's)
M.kind = checkpoint.kind

-- the model's config from a file's shapes (shape(key) -> list or nil;
-- count(pattern) -> one past the largest block index the keys hold), the
-- names by kind; given (opts.config) is taken instead when there is one
local function infer_config(path, kind, prefix, shape, count, given)
  local function sh(k) return shape(prefix .. k) end
  local names = kind == "bfl" and {
    x = "img_in.weight", txt = "txt_in.weight", vec = "vector_in.in_layer.weight", out = "final_layer.linear.weight",
    guid = "guidance_in.in_layer.weight", dq = "double_blocks.%d.img_attn.norm.query_norm.scale",
    sq = "single_blocks.%d.norm.query_norm.scale", double = "^double_blocks%.(%d+)%.", single = "^single_blocks%.(%d+)%.",
  } or {
    x = "x_embedder.weight", txt = "context_embedder.weight", vec = "time_text_embed.text_embedder.linear_1.weight",
    out = "proj_out.weight", guid = "time_text_embed.guidance_embedder.linear_1.weight",
    dq = "transformer_blocks.%d.attn.norm_q.weight", sq = "single_transformer_blocks.%d.attn.norm_q.weight",
    double = "^transformer_blocks%.(%d+)%.", single = "^single_transformer_blocks%.(%d+)%.",
  }
  local x = sh(names.x)
  if not x or #x ~= 2 then fail("%s: tensor '%s' must be a matrix, has shape %s", path, prefix .. names.x, shape_str(x or {})) end
  if VARIANTS[x[2]] and not (given and given.in_channels == x[2]) then
    fail("%s: tensor '%s' has shape %s: an input width of %d is %s, a variant ck.flux does not build "
      .. "(FLUX.1 dev and schnell have 64)", path, prefix .. names.x, shape_str(x), x[2], VARIANTS[x[2]])
  end
  if given then return given end
  local c = {_class_name = "FluxTransformer2DModel", in_channels = x[2], guidance_embeds = shape(prefix .. names.guid) ~= nil}
  local d = x[1]
  local function dim(k, i)
    local s = sh(k)
    if not s then fail("%s: not a whole Flux transformer: no tensor '%s'", path, prefix .. k) end
    return s[i]
  end
  c.joint_attention_dim, c.pooled_projection_dim = dim(names.txt, 2), dim(names.vec, 2)
  c.out_channels = dim(names.out, 1)
  c.num_layers, c.num_single_layers = count(names.double), count(names.single)
  local q = c.num_layers > 0 and names.dq:format(0) or names.sq:format(0)
  local hd = dim(q, 1)
  if d % hd ~= 0 then fail("%s: tensor '%s' has %d entries, which do not divide the width %d into heads", path, prefix .. q, hd, d) end
  c.attention_head_dim, c.num_attention_heads = hd, d // hd
  if hd ~= 128 then
    fail("%s: a head dim of %d (tensor '%s'): the rope axes are known for FLUX.1's 128 only; give the config", path,
      hd, prefix .. q)
  end
  c.axes_dims_rope = {16, 56, 56}
  return c
end

local function config_of(path, c)
  local flux = require "ck.flux"
  local ok, r = pcall(flux.config, c)
  if not ok then fail("%s: %s", path, unplaced(r)) end
  return r
end

-- whether two ck.flux configs build the same model (bookkeeping keys aside)
local function same_model(a, b)
  for key, v in pairs(a) do
    if key:sub(1, 1) ~= "_" then
      local w = b[key]
      if type(v) == "table" then
        if type(w) ~= "table" or #v ~= #w then return false end
        for i = 1, #v do if v[i] ~= w[i] then return false end end
      elseif v ~= w then
        return false
      end
    end
  end
  return true
end

-- the config's name when it is one of ck.flux's
local function variant_name(c)
  local flux = require "ck.flux"
  for _, n in ipairs{"flux-dev", "flux-schnell", "flux-tiny"} do
    if same_model(flux.config(n), c) then return n end
  end
  return nil
end

-- M.map_bfl(keys, shape_of, config, path [, prefix]) -> map {diffusers name = source}:
-- every key (without the prefix) mapped by rule and every parameter of the
-- config sourced, each with the shape the config wants, or refused naming
-- the file and the key. keys: the file's keys (under prefix); shape_of(key)
-- -> its shape. Shared by M.open and tests on key lists.
local function map_bfl(keys, shape_of, config, path, prefix)
  prefix = prefix or ""
  local flux = require "ck.flux"
  local c = config_of(path, config)
  local shapes = flux.parameter_shapes(c)
  local d = flux.inner_dim(c)
  local map = {}
  for _, full in ipairs(keys) do
    local key = full:sub(#prefix + 1)
    local entries = M.bfl_sources(key, d)
    if not entries then fail("%s: tensor '%s' does not map to a Flux transformer parameter", path, full) end
    for _, e in ipairs(entries) do
      if not shapes[e[1]] then
        fail("%s: tensor '%s' maps to '%s', which this Flux transformer (%s) does not have", path, full, e[1],
          variant_name(c) or "the given config")
      end
    end
    local want, have = bfl_shape(entries, shapes), shape_of(full)
    if not same_shape(want, have) then
      fail("%s: tensor '%s' has shape %s, this Flux transformer (%s) needs %s", path, full, shape_str(have),
        variant_name(c) or "the given config", shape_str(want))
    end
    for _, e in ipairs(entries) do
      local src = e[2]
      if type(src) == "string" then src = prefix .. src
      elseif src.key then src = {key = prefix .. src.key, rows = src.rows}
      else src = {{key = prefix .. src[1].key, rows = src[1].rows}, {key = prefix .. src[2].key, rows = src[2].rows}} end
      map[e[1]] = src
    end
  end
  local missing
  for name in pairs(shapes) do
    if not map[name] and (not missing or name < missing) then missing = name end
  end
  if missing then fail("%s: no tensor for the Flux parameter '%s'%s", path, missing,
    c.guidance_embeds and missing:find("guidance", 1, true) and " (a schnell file given as dev?)" or "") end
  return map, c
end
M.map_bfl = public(map_bfl)

-- diffusers' names (a folder's weights or such a single file): each name a
-- parameter of the config with its shape, and every parameter there
local function map_diffusers(names, shape_of, c, path, prefix, where)
  local flux = require "ck.flux"
  local shapes = flux.parameter_shapes(c)
  local map = {}
  for _, full in ipairs(names) do
    local name = full:sub(#prefix + 1)
    local want = shapes[name]
    if not want then
      fail("%s: tensor '%s' is not a parameter of this Flux transformer (%s)", where(full), full,
        variant_name(c) or "its config")
    end
    local have = shape_of(full)
    if not same_shape(want, have) then
      fail("%s: tensor '%s' has shape %s, this Flux transformer (%s) needs %s", where(full), full, shape_str(have),
        variant_name(c) or "its config", shape_str(want))
    end
    map[name] = full
  end
  for name in pairs(shapes) do
    if not map[name] then fail("%s: no tensor for the Flux parameter '%s'", path, name) end
  end
  return map
end

-- ComfyUI's scaled fp8 files (weights times a per-layer scale_weight): not read
local function scaled_fp8(k)
  return k == "scaled_fp8" or k:match("%.scale_weight$") or k:match("%.scale_input$")
end

local TOP = {img_in = 1, txt_in = 1, time_in = 1, vector_in = 1, guidance_in = 1, double_blocks = 1, single_blocks = 1,
             final_layer = 1, x_embedder = 1, context_embedder = 1, time_text_embed = 1, transformer_blocks = 1,
             single_transformer_blocks = 1, norm_out = 1, proj_out = 1}

local function open_single(path, opts)
  local f <close> = ck.safetensors(path)
  local keys, has = f:keys(), {}
  for _, k in ipairs(keys) do has[k] = true end
  for _, k in ipairs(keys) do
    if scaled_fp8(k) then
      fail("%s: tensor '%s': a scaled fp8 file (ComfyUI's scale_weight per layer), which ck.flux does not read; "
        .. "use a plain fp8 (e4m3fn) or bf16 file", path, k)
    end
  end
  local kind, prefix, tell = M.kind(has)
  if kind == "sdxl" then
    fail("%s: an SDXL checkpoint (tensor '%s'), not a Flux transformer; SDXL trains with ck.sdxl", path, tell)
  elseif not kind then
    fail("%s: not a Flux transformer: no tensor 'img_in.weight' (Black Forest Labs' layout, with or without %s) "
      .. "or 'x_embedder.weight' (diffusers')", path, M.PREFIX)
  end
  -- the transformer's keys: all under the prefix; a file with one holds other
  -- parts beside it (ComfyUI's vae.*, text_encoders.*), left to their loaders
  local mine, others = {}, {}
  local shapes = {}
  for _, k in ipairs(keys) do
    if prefix == "" or starts(k, prefix) then
      mine[#mine + 1] = k
    else
      local top = k:match("^([^.]+)")
      if TOP[top] then
        fail("%s: tensor '%s' lacks the %s prefix its other transformer tensors have", path, k, prefix)
      end
      others[#others + 1] = k
    end
  end
  local blocks = {}
  local function shape(k)
    if not has[k] then return nil end
    shapes[k] = shapes[k] or f:shape(k)
    return shapes[k]
  end
  local function count(pattern)
    if blocks[pattern] then return blocks[pattern] end
    local n = 0
    for _, k in ipairs(mine) do
      local i = k:sub(#prefix + 1):match(pattern)
      if i then n = math.max(n, tonumber(i) + 1) end
    end
    blocks[pattern] = n
    return n
  end
  local given = opts.config and config_of(path, opts.config)
  local c = config_of(path, infer_config(path, kind, prefix, shape, count, given))
  local map
  if kind == "bfl" then
    map = map_bfl(mine, shape, c, path, prefix)
  else
    map = map_diffusers(mine, shape, c, path, prefix, function() return path end)
  end
  return {kind = kind == "bfl" and "bfl" or "diffusers_file", file = path, prefix = prefix, config = c,
          variant = variant_name(c), transformer = {file = path, map = map}, other_keys = others}
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then fail("%s", err) end
  local text = f:read("a")
  f:close()
  local ok, v = pcall(ck.json_decode, text)
  if not ok or type(v) ~= "table" then fail("%s: not a JSON object", path) end
  return v
end

-- a diffusers transformer folder (dir holds config.json) or a pipeline folder (dir/transformer)
local function open_folder(path, opts)
  local dir = path
  if not exists(dir .. "/config.json") then dir = path .. "/transformer" end
  local cfile = dir .. "/config.json"
  if not exists(cfile) then
    if exists(path .. "/unet/config.json") then
      fail("%s: a diffusers SDXL folder (unet/config.json), not a Flux transformer; SDXL trains with ck.sdxl", path)
    end
    fail("%s: not a diffusers Flux folder: no transformer/config.json", path)
  end
  local raw = read_json(cfile)
  if rawget(raw, "_class_name") == "UNet2DConditionModel" then
    fail("%s: key '_class_name' is UNet2DConditionModel: an SDXL UNet, not a Flux transformer", cfile)
  end
  local c = config_of(cfile, raw)
  if opts.config then
    local want = config_of(cfile, opts.config)
    if not same_model(want, c) or not same_model(c, want) then
      fail("%s: this config differs from the one given (%s)", cfile, variant_name(want) or "a table")
    end
  end
  local part = checkpoint.folder_weights(dir, "diffusion_pytorch_model", opts.variant)
  -- each name's shape, read from the shard that holds it
  local names, files = {}, {}
  for name, src in pairs(part.map) do
    names[#names + 1] = name
    local file = type(src) == "table" and src.file or part.file
    files[file] = files[file] or {}
    files[file][#files[file] + 1] = name
  end
  table.sort(names)
  local shapes, where = {}, {}
  for file, list in pairs(files) do
    local f <close> = ck.safetensors(file)
    for _, n in ipairs(list) do
      shapes[n], where[n] = f:shape(n), file
      if scaled_fp8(n) then fail("%s: tensor '%s': a scaled fp8 file, which ck.flux does not read", file, n) end
    end
  end
  local map = map_diffusers(names, function(n) return shapes[n] end, c, part.file, "", function(n) return where[n] end)
  for name in pairs(map) do map[name] = part.map[name] end
  return {kind = "diffusers", file = path, config = c, variant = variant_name(c),
          transformer = {file = part.file, files = part.files, map = map}, config_file = cfile}
end

-- M.open(path [, {config = name | table, variant = "fp16"}]) -> a description
-- {kind = "bfl" | "diffusers" | "diffusers_file", file, config (ck.flux's, from
-- the file's shapes or config.json, or opts.config checked against them),
-- variant ("flux-dev", "flux-schnell", "flux-tiny" or nil), transformer =
-- {file, map} (checkpoint.load's part), prefix, other_keys (a single file's
-- tensors of other parts: ComfyUI's vae.*, text_encoders.*)}. A Flux variant
-- ck.flux does not build (Fill, Canny, Depth: their img_in widths), an SDXL
-- file or folder, a key no rule maps, a missing parameter and a shape the
-- config does not have are refused in one line naming the file and the key.
M.open = public(function(path, opts)
  if type(path) ~= "string" then fail("flux_keys.open: path must be a string, got %s", type(path)) end
  opts = opts or {}
  if ck.listdir(path) then return open_folder(path, opts) end
  return open_single(path, opts)
end)

-- M.load(p, desc, params) -> count: loads params (tensors or names: the
-- transformer's frozen parameters) from desc (M.open's) through p:load;
-- refusals as checkpoint.load's
M.load = public(function(p, desc, params)
  if type(desc) ~= "table" or type(desc.transformer) ~= "table" then fail("flux_keys.load: not a flux_keys.open description") end
  return checkpoint.load(p, "transformer", desc.transformer, params)
end)

-- M.identify(path) -> a one-line description when path (a file or folder) holds
-- a Flux transformer, else nil: for loaders of other families to refuse it by name
function M.identify(path)
  local ok, r = pcall(function()
    if ck.listdir(path) then
      for _, c in ipairs{path .. "/transformer/config.json", path .. "/config.json"} do
        if exists(c) then
          local j = read_json(c)
          if rawget(j, "_class_name") == "FluxTransformer2DModel" then return c .. " is a FluxTransformer2DModel" end
        end
      end
      return nil
    end
    local f <close> = ck.safetensors(path)
    local has = {}
    for _, k in ipairs(f:keys()) do has[k] = true end
    local kind, _, tell = M.kind(has)
    if kind == "bfl" or kind == "diffusers" then return "a Flux transformer (tensor '" .. tell .. "')" end
    return nil
  end)
  return ok and r or nil
end

return M
