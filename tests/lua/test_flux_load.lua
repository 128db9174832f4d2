-- Flux.1 transformer weights in the forms users have them (ck.flux_keys):
-- tests/ref/make_flux_ref.py saved a random flux-tiny as diffusers saves it
-- (a sharded transformer/ folder) and in Black Forest Labs' layout (checked
-- there against diffusers' own conversion), plus ComfyUI's fp8 form. Here:
-- every layout loads bitwise what the folder holds, the fp8 file's forward is
-- diffusers' on its weights, FLUX.1-dev's full BFL key list maps by rule onto
-- its parameters, p:load's pieces do what they say, and bad input (Flux
-- variants, SDXL given as Flux and the reverse, unknown, missing and
-- misshaped keys) is refused in one line naming the file and the key.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local flux = require "ck.flux"
local fk = require "ck.flux_keys"
local checkpoint = require "ck.checkpoint"

local REF = "tests/data/flux/"
local FOLDER, BFL, FP8 = REF .. "transformer", REF .. "bfl.safetensors", REF .. "bfl_fp8.safetensors"
local SDXL_FILE, SDXL_FOLDER = "tests/data/checkpoint/sdxl_tiny.safetensors", "tests/data/checkpoint/sdxl_tiny"

local tmp = string.format("out/test_flux_load.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function path(name) return tmp .. "/" .. name end

-- err is one line, from this script, naming every one of `words`
local function one_line(err, ...)
  err = tostring(err)
  if err:find("\n") or not err:find("test_flux_load.lua:%d+:") then return false end
  for _, w in ipairs{...} do
    if not err:find(w, 1, true) then return false end
  end
  return true
end

-- pcall of f(...) called from this script's line, as a script calls it
local function try(f, ...)
  local args = table.pack(...)
  return pcall(function()
    local r = table.pack(f(table.unpack(args, 1, args.n))) -- not a tail call: this line is the caller
    return table.unpack(r, 1, r.n)
  end)
end

-- a flux-tiny forward graph's program with every base parameter loaded from desc
local function loaded(desc)
  local g = ck.graph()
  local _, y, x = flux.build(g, "flux-tiny", {batch = 2, height = 4, width = 6, tokens = 5, frozen = true})
  local p = g:compile{outputs = {y}, optimizer = "none"}
  local n = fk.load(p, desc, g:params())
  return p, g, n, y, x
end

-- every parameter of two programs bitwise equal: nil, or the first that differs
local function differs(g, a, b)
  for _, t in ipairs(g:params()) do
    if a:checksum(t.name) ~= b:checksum(t.name) then return t.name end
  end
  return nil
end

-- writes a BFL-layout file from the reference file: keys renamed by rename(key)
-- (nil drops one), extra {key, shape, values} entries added
local function variant(name, rename, extra, dtype)
  local f <close> = ck.safetensors(BFL)
  local out = {}
  for _, k in ipairs(f:keys()) do
    local nk = k
    if rename then nk = rename(k) end
    if nk then out[#out + 1] = {nk, f:shape(k), f:read(k)} end
  end
  for _, e in ipairs(extra or {}) do out[#out + 1] = e end
  ck.write_safetensors(path(name), out, nil, dtype or "BF16")
  return path(name)
end

local folder = fk.open(FOLDER)
local ref_p, ref_g = loaded(folder)

do -- the folder: config.json read, shards mapped by name
  T.ok(folder.kind == "diffusers" and folder.variant == "flux-tiny" and folder.config.num_single_layers == 2
    and #folder.transformer.files == 2, "the sharded diffusers folder opens as flux-tiny, its two shards mapped")
  local whole = fk.open(REF:sub(1, -2))
  T.ok(whole.transformer.file == folder.transformer.file, "a pipeline folder's transformer/ opens the same")
end

do -- Black Forest Labs' single file, bf16, no prefix: bitwise the folder's values
  local d = fk.open(BFL, {config = "flux-tiny"})
  local p, g, n = loaded(d)
  T.ok(d.kind == "bfl" and d.prefix == "" and d.variant == "flux-tiny" and n == 112,
    "the BFL file's 88 tensors map onto flux-tiny's 112 parameters (" .. n .. " loaded)")
  local bad = differs(g, p, ref_p)
  T.ok(not bad, "qkv in three, linear1 in four, final adaLN halves swapped: every parameter bitwise the folder's"
    .. (bad and (", not " .. bad) or ""))
  local m = d.transformer.map
  T.ok(m["single_transformer_blocks.1.proj_mlp.weight"].rows[1] == 97 and m["single_transformer_blocks.1.proj_mlp.weight"].rows[2] == 128
    and m["norm_out.linear.bias"][1].rows[1] == 33 and m["norm_out.linear.bias"][2].rows[1] == 1,
    "proj_mlp is linear1's rows 97..224; norm_out's scale is BFL's second half, its shift the first")
end

do -- ComfyUI's form: model.diffusion_model. before every key, beside other parts' tensors
  local name = variant("prefixed.safetensors", function(k) return fk.PREFIX .. k end,
    {{"vae.decoder.conv_in.weight", {2}, {1, 2}}, {"text_encoders.clip_l.logit_scale", {1}, {1}}})
  local d = fk.open(name, {config = "flux-tiny"})
  local p, g = loaded(d)
  T.ok(d.prefix == fk.PREFIX and #d.other_keys == 2 and not differs(g, p, ref_p),
    "with the prefix (other parts' tensors left to their loaders): bitwise the folder's")
end

do -- fp8 e4m3 matrices with bf16 vectors, prefixed: the forward is diffusers' on the fp8 weights
  local d = fk.open(FP8, {config = "flux-tiny"})
  local p, _, _, y, x = loaded(d)
  local f <close> = ck.safetensors(REF .. "ref.safetensors")
  local f8 <close> = ck.safetensors(FP8)
  T.ok(f8:dtype(fk.PREFIX .. "double_blocks.0.img_attn.qkv.weight") == "F8_E4M3" and
       f8:dtype(fk.PREFIX .. "double_blocks.0.img_attn.qkv.bias") == "BF16", "the fp8 file holds F8_E4M3 matrices")
  for _, k in ipairs{"encoder_hidden_states", "pooled_projections", "timestep", "guidance"} do p:set(x[k], f:read(k)) end
  p:set(x.hidden_states, f:read("packed"))
  p:set(x.rope, flux.rope_values("flux-tiny", 5, 4, 6))
  p:forward()
  local got, want, e, m = p:get(y), f:read("out_fp8"), 0, 0
  for i = 1, #want do e, m = math.max(e, math.abs(got[i] - want[i])), math.max(m, math.abs(want[i])) end
  T.ok(#got == #want and e / m < 1e-5, string.format("the fp8 file's forward is diffusers' on its weights (worst %.2g)", e / m))
end

do -- a single file in diffusers' names (the folder's shards as one file)
  local out = {}
  for _, shard in ipairs(folder.transformer.files) do
    local f <close> = ck.safetensors(shard)
    for _, k in ipairs(f:keys()) do out[#out + 1] = {k, f:shape(k), f:read(k)} end
  end
  ck.write_safetensors(path("diffusers_names.safetensors"), out, nil, "BF16")
  local d = fk.open(path("diffusers_names.safetensors"), {config = "flux-tiny"})
  local p, g = loaded(d)
  T.ok(d.kind == "diffusers_file" and not differs(g, p, ref_p), "a single file in diffusers' names loads by name")
end

do -- FLUX.1-dev's 780 BFL keys (make_flux_ref.py's inverse of diffusers' conversion on the meta model)
  local keys, shapes = {}, {}
  for line in io.lines(REF .. "flux_dev_bfl_keys.txt") do
    local k, s = line:match("^(%S+) %[([%d,]*)%]$")
    local sh = {}
    for v in s:gmatch("%d+") do sh[#sh + 1] = tonumber(v) end
    keys[#keys + 1], shapes[k] = k, sh
  end
  local map = fk.map_bfl(keys, function(k) return shapes[k] end, "flux-dev", "flux1-dev.safetensors")
  local n = 0
  for _ in pairs(map) do n = n + 1 end
  local l1 = {}
  for _, part in ipairs{"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"} do
    local r = map["single_transformer_blocks.37." .. part .. ".weight"].rows
    l1[#l1 + 1] = r[1] .. "+" .. r[2]
  end
  T.ok(#keys == 780 and n == 1160, "FLUX.1-dev's 780 BFL tensors map onto its 1160 parameters")
  T.ok(table.concat(l1, " ") == "1+3072 3073+3072 6145+3072 9217+12288",
    "linear1 [21504, 3072] splits into rows of 3072, 3072, 3072 and 12288: " .. table.concat(l1, " "))
  local no = map["norm_out.linear.weight"]
  T.ok(no[1].key == "final_layer.adaLN_modulation.1.weight" and no[1].rows[1] == 3073 and no[2].rows[1] == 1
    and map["transformer_blocks.18.attn.add_v_proj.bias"].rows[1] == 6145,
    "the final adaLN's halves swap; txt_attn.qkv's third block of rows is add_v_proj")
  local schnell = {}
  for _, k in ipairs(keys) do if not k:find("^guidance_in") then schnell[#schnell + 1] = k end end
  local sm = fk.map_bfl(schnell, function(k) return shapes[k] end, "flux-schnell", "flux1-schnell.safetensors")
  n = 0
  for _ in pairs(sm) do n = n + 1 end
  T.ok(#schnell == 776 and n == 1156, "schnell's 776 BFL tensors map onto its 1156 parameters")
  local ok, err = try(fk.map_bfl, schnell, function(k) return shapes[k] end, "flux-dev", "flux1-schnell.safetensors")
  T.ok(not ok and one_line(err, "flux1-schnell.safetensors", "time_text_embed.guidance_embedder", "a schnell file given as dev"),
    "a schnell file read as dev is refused: " .. tostring(err))
  ok, err = try(fk.map_bfl, keys, function(k) return shapes[k] end, "flux-schnell", "flux1-dev.safetensors")
  T.ok(not ok and one_line(err, "flux1-dev.safetensors", "'guidance_in.", "does not have"),
    "a dev file read as schnell is refused: " .. tostring(err))
end

do -- p:load's pieces: blocks of rows laid one after another
  ck.write_safetensors(path("pieces.safetensors"), {{"m", {3, 2}, {1, 2, 3, 4, 5, 6}}, {"n", {1, 2}, {7, 8}}})
  local g = ck.graph()
  local w, v = g:param("w", {4, 2}), g:param("v", {2, 2})
  local p = g:compile{outputs = {w, v}, optimizer = "none"}
  local f <close> = ck.safetensors(path("pieces.safetensors"))
  p:load(f, {w = {{key = "m", rows = {2, 2}}, {key = "n"}, {key = "m", rows = {1, 1}}}})
  local function shown(t) local r = {} for i, x in ipairs(t) do r[i] = string.format("%g", x) end return table.concat(r, " ") end
  local got = shown(p:get(w))
  T.ok(got == "3 4 5 6 7 8 1 2", "pieces {m rows 2-3, n, m row 1} load in order: " .. got)
  p:set(v, {9, 9, 9, 9})
  local cases = {
    {{v = {{key = "m", rows = {1, 1}}}}, "the pieces of 'v' [2, 2] hold 1 rows, it has 2"},
    {{v = {{key = "m", rows = {1, 1}}, {key = "m", rows = {2, 2}}}}, "the pieces of 'v' [2, 2] hold 3 rows"},
    {{v = {{key = "m", rows = {3, 2}}}}, "no 2 rows from row 3"},
    {{v = {{key = "m", transpose = true}}}, "pieces take key and rows only"},
    {{v = {"m"}}, "piece 1 of 'v' is a string"},
    {{v = {{key = "z"}}}, "missing tensor 'z'"},
  }
  for i, c in ipairs(cases) do
    local ok, err = pcall(p.load, p, f, c[1])
    T.ok(not ok and tostring(err):find(c[2], 1, true), "bad pieces " .. i .. " refused: " .. tostring(err))
  end
  T.ok(shown(p:get(v)) == "9 9 9 9", "a refused load leaves the parameter as it was")
  g = ck.graph()
  local x3 = g:param("x3", {2, 3})
  p = g:compile{outputs = {x3}, optimizer = "none"}
  local ok, err = pcall(p.load, p, f, {x3 = {{key = "m", rows = {1, 2}}}})
  T.ok(not ok and tostring(err):find("rows 1 to 2 has shape [2, 2]: not a block of rows of 'x3' [2, 3]", 1, true),
    "a piece whose rows are not the parameter's width is refused: " .. tostring(err))
end

do -- Flux variants ck.flux does not build, named by their img_in width
  for _, v in ipairs{{384, "FLUX.1 Fill"}, {128, "FLUX.1 Canny or Depth"}} do
    local zeros = {}
    for i = 1, 32 * v[1] do zeros[i] = 0 end
    local name = variant("variant" .. v[1] .. ".safetensors", function(k) return k ~= "img_in.weight" and k or nil end,
      {{"img_in.weight", {32, v[1]}, zeros}})
    local ok, err = try(fk.open, name, {config = "flux-tiny"})
    T.ok(not ok and one_line(err, name, "'img_in.weight'", "[32, " .. v[1] .. "]", v[2]),
      v[2] .. " is refused by its img_in width: " .. tostring(err))
  end
end

do -- SDXL given as Flux, and Flux given as SDXL
  local ok, err = try(fk.open, SDXL_FILE)
  T.ok(not ok and one_line(err, SDXL_FILE, "an SDXL checkpoint", "'model.diffusion_model.input_blocks.0.0.weight'"),
    "an SDXL single file given as Flux: " .. tostring(err))
  ok, err = try(fk.open, SDXL_FOLDER)
  T.ok(not ok and one_line(err, SDXL_FOLDER, "a diffusers SDXL folder (unet/config.json)"),
    "an SDXL folder given as Flux: " .. tostring(err))
  ok, err = try(checkpoint.open, BFL)
  T.ok(not ok and one_line(err, BFL, "a Flux transformer (tensor 'img_in.weight')", "not an SDXL checkpoint"),
    "a Flux single file given as SDXL: " .. tostring(err))
  ok, err = try(checkpoint.open, FP8)
  T.ok(not ok and one_line(err, FP8, "'model.diffusion_model.img_in.weight'", "not an SDXL checkpoint"),
    "ComfyUI's prefixed Flux file given as SDXL: " .. tostring(err))
  ok, err = try(checkpoint.open, REF:sub(1, -2))
  T.ok(not ok and one_line(err, "a diffusers Flux folder (transformer/config.json)"),
    "a Flux folder given as SDXL: " .. tostring(err))
  T.ok(fk.identify(BFL) == "a Flux transformer (tensor 'img_in.weight')" and fk.identify(REF:sub(1, -2)) ~= nil
    and fk.identify(FOLDER) ~= nil and fk.identify(SDXL_FILE) == nil and fk.identify(SDXL_FOLDER) == nil
    and fk.identify(path("nothing")) == nil, "flux_keys.identify tells Flux files and folders from SDXL's")
end

do -- keys no rule maps, beyond the config, missing, misshaped; scaled fp8; a mixed prefix; no config
  local f <close> = ck.safetensors(BFL)
  local qkv = f:read("double_blocks.0.img_attn.qkv.weight")
  local zeros96 = {}
  for i = 1, 96 do zeros96[i] = 0 end
  local cases = {
    {"unknown", nil, {{"double_blocks.0.img_attn.extra.weight", {2}, {0, 0}}},
     {"'double_blocks.0.img_attn.extra.weight'", "does not map"}},
    {"beyond", nil, {{"double_blocks.2.img_attn.qkv.weight", {96, 32}, qkv}},
     {"'double_blocks.2.img_attn.qkv.weight'", "'transformer_blocks.2.attn.to_q.weight'", "(flux-tiny) does not have"}},
    {"missing", function(k) return k ~= "single_blocks.1.linear2.bias" and k or nil end, nil,
     {"no tensor for the Flux parameter 'single_transformer_blocks.1.proj_out.bias'"}},
    {"misshaped", function(k) return k ~= "single_blocks.0.linear1.bias" and k or nil end,
     {{"single_blocks.0.linear1.bias", {96}, zeros96}}, {"'single_blocks.0.linear1.bias' has shape [96]", "needs [224]"}},
    {"scaled", nil, {{"scaled_fp8", {1}, {0}}}, {"'scaled_fp8'", "a scaled fp8 file"}},
    {"schnell", function(k) return not k:find("^guidance_in") and k or nil end, nil,
     {"'time_text_embed.guidance_embedder.", "(a schnell file given as dev?)"}},
  }
  for _, c in ipairs(cases) do
    local name = variant(c[1] .. ".safetensors", c[2], c[3])
    local ok, err = try(fk.open, name, {config = "flux-tiny"})
    T.ok(not ok and one_line(err, name, table.unpack(c[4])), "a " .. c[1] .. " tensor is refused: " .. tostring(err))
  end
  local name = variant("mixed.safetensors", function(k) return k == "img_in.bias" and k or fk.PREFIX .. k end)
  local ok, err = try(fk.open, name, {config = "flux-tiny"})
  T.ok(not ok and one_line(err, name, "'img_in.bias' lacks the model.diffusion_model. prefix"),
    "a transformer tensor without the others' prefix: " .. tostring(err))
  ok, err = try(fk.open, BFL)
  T.ok(not ok and one_line(err, BFL, "a head dim of 16", "give the config"),
    "without a config, a head dim other than FLUX.1's 128 is refused: " .. tostring(err))
  ok, err = try(fk.open, path("nothing.safetensors"))
  T.ok(not ok and one_line(err, "nothing.safetensors"), "a missing file: " .. tostring(err))
  ck.write_safetensors(path("other.safetensors"), {{"encoder.block.0.weight", {1}, {1}}})
  ok, err = try(fk.open, path("other.safetensors"))
  T.ok(not ok and one_line(err, "other.safetensors", "not a Flux transformer: no tensor 'img_in.weight'"),
    "a file of something else: " .. tostring(err))
end

do -- a folder whose config.json disagrees with its weights, or with the config asked for
  local dir = path("folder")
  assert(ck.mkdir(dir))
  local cfg = ck.json_decode(io.open(FOLDER .. "/config.json"):read("a"))
  cfg.num_single_layers = 3
  local o = assert(io.open(dir .. "/config.json", "wb"))
  o:write(ck.json_encode(cfg))
  o:close()
  for _, n in ipairs(ck.listdir(FOLDER)) do
    if n ~= "config.json" then
      local i, w = assert(io.open(FOLDER .. "/" .. n, "rb")), assert(io.open(dir .. "/" .. n, "wb"))
      w:write(i:read("a"))
      i:close()
      w:close()
    end
  end
  local ok, err = try(fk.open, dir)
  T.ok(not ok and one_line(err, dir, "no tensor for the Flux parameter 'single_transformer_blocks.2."),
    "a config with more blocks than its weights: " .. tostring(err))
  ok, err = try(fk.open, FOLDER, {config = "flux-dev"})
  T.ok(not ok and one_line(err, FOLDER .. "/config.json", "differs from the one given (flux-dev)"),
    "a folder that is not the config asked for: " .. tostring(err))
  cfg.num_single_layers, cfg.qk_norm = 2, "layer_norm"
  o = assert(io.open(dir .. "/config.json", "wb"))
  o:write(ck.json_encode(cfg))
  o:close()
  ok, err = try(fk.open, dir)
  T.ok(not ok and one_line(err, dir .. "/config.json", "key 'qk_norm'"), "a config key ck.flux lacks: " .. tostring(err))
  for _, n in ipairs(ck.listdir(dir)) do os.remove(dir .. "/" .. n) end
  os.remove(dir)
end

for _, name in ipairs(ck.listdir(tmp)) do os.remove(path(name)) end
os.remove(tmp)
T.done()
