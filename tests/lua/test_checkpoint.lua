-- Base models in the forms users have them (ck.checkpoint): a tiny SDXL saved
-- by tests/ref/make_checkpoint_ref.py as a diffusers folder and as an SGM
-- single file (F16; part of it in BF16), both proven equal there through
-- diffusers' own single-file loaders. Here: the single file maps by rule to
-- the folder's names, both forms load into programs bitwise equal (UNet,
-- VAE, both text encoders, a sharded one among them), p:load's transforms do
-- what they say, and bad input is refused with one line naming the key, the
-- file and this script's line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local checkpoint = require "ck.checkpoint"

local DATA = "tests/data/checkpoint"
local FOLDER = DATA .. "/sdxl_tiny"
local SINGLE, BF16 = DATA .. "/sdxl_tiny.safetensors", DATA .. "/sdxl_tiny_bf16.safetensors"
local PARTS = {"unet", "vae", "text_encoder", "text_encoder_2"}

local tmp = string.format("out/test_checkpoint.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function path(name) return tmp .. "/" .. name end

local function sorted_keys(t)
  local r = {}
  for k in pairs(t) do r[#r + 1] = k end
  table.sort(r)
  return r
end

-- err is one line, from this script, naming every one of `words`
local function one_line(err, ...)
  err = tostring(err)
  if err:find("\n") or not err:find("test_checkpoint.lua:%d+:") then return false end
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

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- the file and key a map's source reads
local function source_of(part, name)
  local src = part.map[name]
  if type(src) == "table" then return src.file or part.file, src.key end
  return part.file, src
end

-- f:read of a source, through a cache of open files
local files = {}
local function file(p)
  files[p] = files[p] or ck.safetensors(p)
  return files[p]
end

local folder = checkpoint.open(FOLDER)
local single = checkpoint.open(SINGLE, {unet_config = folder.unet_config})

do -- what open describes
  T.ok(folder.kind == "diffusers" and single.kind == "single", "a folder opens as diffusers, the file as single")
  T.ok(folder.unet.file == FOLDER .. "/unet/diffusion_pytorch_model.fp16.safetensors"
    and folder.vae.file == FOLDER .. "/vae/diffusion_pytorch_model.safetensors"
    and folder.text_encoder.file == FOLDER .. "/text_encoder/model.safetensors"
    and folder.text_encoder_2.file == FOLDER .. "/text_encoder_2/model.safetensors.index.json"
    and #folder.text_encoder_2.files == 2,
    "the folder's weights: the fp16 variant, the plain names, and a sharded index of 2 files")
  T.ok(folder.unet_config.cross_attention_dim == 20 and folder.vae_config.latent_channels == 4
    and folder.text_encoder_config.hidden_size == 8 and folder.text_encoder_2_config.projection_dim == 8,
    "the folder's configs are its parsed config.json files")
  T.ok(folder.tokenizer == FOLDER .. "/tokenizer" and folder.tokenizer_2 == FOLDER .. "/tokenizer_2"
    and single.tokenizer == nil, "the folder names its tokenizer directories; a single file has none")
  T.ok(single.unet.file == SINGLE and single.vae.file == SINGLE and single.unet_config == folder.unet_config,
    "every part of the single file reads from the file; unet_config is the one given")
  T.ok(file(SINGLE):dtype("model.diffusion_model.input_blocks.0.0.weight") == "F16"
    and file(BF16):dtype("model.diffusion_model.input_blocks.0.0.weight") == "BF16", "the files are F16 and BF16")
  for _, part in ipairs(PARTS) do
    local a, b = sorted_keys(folder[part].map), sorted_keys(single[part].map)
    T.ok(#a > 0 and same(a, b), string.format("%s: the single file maps to the folder's %d names, no more, no fewer",
      part, #a))
  end
  local m = single.text_encoder_2.map
  local q = m["text_model.encoder.layers.1.self_attn.q_proj.weight"]
  local v = m["text_model.encoder.layers.1.self_attn.v_proj.bias"]
  T.ok(type(q) == "table" and q.key == "conditioner.embedders.1.model.transformer.resblocks.1.attn.in_proj_weight"
    and same(q.rows, {1, 12}) and type(v) == "table" and same(v.rows, {25, 12}),
    "OpenCLIP's fused in_proj splits by rows: q rows 1..12, v rows 25..36")
  local tp = m["text_projection.weight"]
  T.ok(type(tp) == "table" and tp.transpose == true and tp.key == "conditioner.embedders.1.model.text_projection",
    "text_projection loads transposed")
  local vq = single.vae.map["decoder.mid_block.attentions.0.to_q.weight"]
  T.ok(type(vq) == "table" and vq.reshape == true and vq.key == "first_stage_model.decoder.mid.attn_1.q.weight",
    "the VAE's 1x1 conv q loads reshaped into Linear to_q")
  T.ok(single.unet.map["up_blocks.1.upsamplers.0.conv.weight"] == "model.diffusion_model.output_blocks.5.2.conv.weight"
    and single.unet.map["down_blocks.1.downsamplers.0.conv.bias"] == "model.diffusion_model.input_blocks.6.0.op.bias"
    and single.unet.map["up_blocks.0.resnets.2.conv_shortcut.weight"]
      == "model.diffusion_model.output_blocks.2.0.skip_connection.weight"
    and single.unet.map["add_embedding.linear_2.weight"] == "model.diffusion_model.label_emb.0.2.weight",
    "UNet names by rule: upsampler after an attention at .2, downsampler .0.op, skip_connection, label_emb")
end

-- a graph of part's parameters by name, shaped as the folder's tensors
local function raw_program(part, names)
  local g = ck.graph()
  local ts = {}
  for i, name in ipairs(names) do
    local f, key = source_of(folder[part], name)
    ts[i] = g:param(name, file(f):shape(key), {trainable = false})
  end
  return g, g:compile{outputs = {ts[1]}}, ts -- parameters keep their values, outputs or not
end

-- every parameter of p equal to the folder's tensor, bit for bit, after round
local function equal_to_folder(p, part, ts, round)
  for _, t in ipairs(ts) do
    local f, key = source_of(folder[part], t.name)
    local want, got = file(f):read(key), p:get(t)
    if #want ~= #got then return false, t.name end
    for i = 1, #want do
      if got[i] ~= (round and round(want[i]) or want[i]) then return false, t.name end
    end
  end
  return true
end

do -- the UNet, built from the folder's config.json, loads equal from both forms
  local cfg = checkpoint.unet_config(folder.unet_config, FOLDER .. "/unet/config.json")
  local function build(seed)
    local g = ck.graph()
    local _, y, x = unet.build(g, unet.UNet2DConditionModel(cfg), {batch = 1, height = 8, width = 8, frozen = true,
                                                                     tokens = 4})
    local p = g:compile{outputs = {y}, seed = seed}
    T.set_random(p, 5, {x.sample, x.encoder_hidden_states, x.text_embeds})
    p:set(x.timesteps, {300})
    p:set(x.time_ids, {64, 64, 0, 0, 64, 64})
    return g, p, y
  end
  local g1, p1, y1 = build(1)
  local g2, p2, y2 = build(2)
  local params = g1:params()
  T.ok(#params == 618, string.format("the tiny UNet has 618 parameters (%d)", #params))
  T.ok(checkpoint.load(p1, "unet", folder.unet, params) == 618, "618 load from the folder")
  T.ok(checkpoint.load(p2, "unet", single.unet, g2:params()) == 618, "618 load from the single file")
  local ok, bad = equal_to_folder(p1, "unet", params)
  T.ok(ok, "the folder's UNet is loaded as stored: " .. tostring(bad))
  ok, bad = equal_to_folder(p2, "unet", g2:params())
  T.ok(ok, "the single file's UNet equals the folder's, every parameter bitwise: " .. tostring(bad))
  p1:forward(); p2:forward()
  local out = p1:get(y1)
  T.ok(same(out, p2:get(y2)) and out[1] == out[1], "and both forms give the same output")

  -- a shape that differs: this UNet's cross attention takes 24 channels, the file's 20
  local c24 = checkpoint.unet_config(folder.unet_config)
  c24.cross_attention_dim = 24
  local g = ck.graph()
  local _, y = unet.build(g, unet.UNet2DConditionModel(c24), {batch = 1, height = 8, width = 8, frozen = true,
                                                               tokens = 4})
  local p = g:compile{outputs = {y}}
  local err
  ok, err = try(checkpoint.load, p, "unet", single.unet, g:params())
  T.ok(not ok and one_line(err, SINGLE)
    and err:find("attn2%.to_[kv]%.weight' has shape %[%d+, 20%], expected %[%d+, 24%]"),
    "a UNet whose shapes differ from the file's is refused naming the key and the file: " .. tostring(err))
end

for _, part in ipairs{"vae", "text_encoder", "text_encoder_2"} do
  local names = sorted_keys(folder[part].map)
  local _, p1, ts1 = raw_program(part, names)
  local _, p2, ts2 = raw_program(part, names)
  T.ok(checkpoint.load(p1, part, folder[part], ts1) == #names
    and checkpoint.load(p2, part, single[part], ts2) == #names,
    string.format("%s: all %d parameters load from both forms", part, #names))
  local ok1, bad1 = equal_to_folder(p1, part, ts1)
  local ok2, bad2 = equal_to_folder(p2, part, ts2)
  T.ok(ok1 and ok2, string.format("%s: the single file's tensors equal the folder's bitwise (%s)", part,
    tostring(bad1 or bad2)))
end

do -- SDXL base's own layout (no config given): the rule maps all 1680 UNet names as ck.lora's
   -- diffusers -> SGM paths (written apart, for kohya's names) do, on a file of those names
  local lora = require "ck.lora"
  local g = ck.graph()
  local entries, want = {}, {}
  local big = {["conv_in.weight"] = true, ["add_embedding.linear_1.weight"] = true} -- the identifying shapes
  for line in io.lines("tests/data/sdxl_full_keys.txt") do
    local name, dims = line:match("^(%S+) %[([%d,]*)%]$")
    local shape = {1}
    if big[name] then
      shape = {}
      for d in dims:gmatch("%d+") do shape[#shape + 1] = tonumber(d) end
    end
    local key = "model.diffusion_model." .. lora.sgm_path(name)
    want[name] = key
    entries[#entries + 1] = {key, g:param(key, shape, {trainable = false, init = "zeros"})}
  end
  local p = g:compile{outputs = {entries[1][2]}}
  p:save(path("sdxl_names.safetensors"), entries, {dtype = "F16"})
  local desc = checkpoint.open(path("sdxl_names.safetensors"))
  local n, bad = 0, nil
  for name, key in pairs(want) do
    n = n + 1
    if desc.unet.map[name] ~= key then bad = bad or name end
  end
  local m = 0
  for _ in pairs(desc.unet.map) do m = m + 1 end
  T.ok(n == 1680 and m == 1680 and not bad and desc.unet_config == nil,
    string.format("SDXL base: %d of %d names map as ck.lora's SGM paths (first wrong: %s)", m, n, tostring(bad)))
  os.remove(path("sdxl_names.safetensors"))
end

do -- BF16: the same values rounded to bf16 (nearest even), through the same maps
  local function bf16(x)
    local b = string.unpack("<I4", string.pack("<f", x))
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return (string.unpack("<f", string.pack("<I4", b)))
  end
  local half = checkpoint.open(BF16, {unet_config = folder.unet_config})
  local checked, seen = 0, {}
  for _, part in ipairs(PARTS) do
    local names = sorted_keys(half[part].map)
    local _, p, ts = raw_program(part, names)
    checkpoint.load(p, part, half[part], ts)
    local ok, bad = equal_to_folder(p, part, ts, bf16)
    T.ok(ok and #names > 0, string.format("%s: %d tensors from BF16 equal the folder's rounded to bf16 (%s)", part,
      #names, tostring(bad)))
    checked = checked + #names
    for _, n in ipairs(names) do seen[n] = true end
  end
  T.ok(seen["encoder.mid_block.attentions.0.to_k.weight"] and seen["text_model.encoder.layers.0.self_attn.k_proj.bias"]
    and seen["text_projection.weight"] and seen["down_blocks.1.attentions.0.proj_in.weight"]
    and seen["add_embedding.linear_1.weight"],
    string.format("the BF16 checks cover the reshape, the row split, the transpose and the UNet (%d tensors)", checked))
end

do -- p:load's sources, on a file of known values
  local vals = {1, 2, 3, 4, 5, 6}
  ck.write_safetensors(path("m.safetensors"), {{"m", {3, 2}, vals}, {"v", {6}, vals}})
  local g = ck.graph()
  local tr = g:param("tr", {2, 3}, {trainable = false})
  local rows = g:param("rows", {2, 2}, {trainable = false})
  local re = g:param("re", {6, 1, 1}, {trainable = false})
  local tr_rows = g:param("tr_rows", {2, 1}, {trainable = false})
  local plain = g:param("plain", {6}, {trainable = false})
  local p = g:compile{outputs = {tr, rows, re, tr_rows, plain}}
  local f <close> = ck.safetensors(path("m.safetensors"))
  p:load(f, {tr = {key = "m", transpose = true}, rows = {key = "m", rows = {2, 2}}, re = {key = "v", reshape = true},
             tr_rows = {key = "m", rows = {3, 1}, transpose = true}, plain = "v"})
  T.ok(same(p:get(tr), {1, 3, 5, 2, 4, 6}), "transpose: [3, 2] into [2, 3], element (i, j) from (j, i)")
  T.ok(same(p:get(rows), {3, 4, 5, 6}), "rows {2, 2}: the second and third rows")
  T.ok(same(p:get(re), vals), "reshape: [6] into [6, 1, 1], values in order")
  T.ok(same(p:get(tr_rows), {5, 6}), "rows then transpose: row 3 [1, 2] as [2, 1]")
  T.ok(same(p:get(plain), vals), "a string source loads as before")
  local cases = {
    {{tr = {key = "m", rows = {3, 2}}}, "no 2 rows from row 3"},
    {{re = {key = "m", transpose = true}}, "transposed has shape [2, 3], expected [6, 1, 1]"},
    {{tr = {key = "v", transpose = true}}, "only a 2-D tensor transposes"},
    {{plain = {key = "m", rows = {1, 2}, reshape = true}}, "rows 1 to 2 has shape [2, 2], expected [6] (or as many"},
    {{tr = {key = "m", tranpose = true}}, "unknown field 'tranpose'"},
    {{tr = {key = "m", rows = {0, 1}}}, "must start at 1"},
    {{tr = {key = "m", rows = {math.maxinteger, math.maxinteger}}}, "no 9223372036854775807 rows from row"},
    {{tr = setmetatable({}, {__index = {key = "m"}})}, "needs key"},
    {{tr = {key = "nope", transpose = true}}, "missing tensor 'nope'"},
  }
  for _, c in ipairs(cases) do
    local ok, err = pcall(p.load, p, f, c[1])
    T.ok(not ok and one_line(err, c[2]), "refused: " .. c[2] .. ": " .. tostring(err))
  end
  T.ok(same(p:get(tr), {1, 3, 5, 2, 4, 6}) and same(p:get(plain), vals),
    "a refused load leaves the values as they were")
end

do -- bad models and files, each refused with one line naming the key and the file
  local ok, err
  -- a parameter the map has no source for
  local g = ck.graph()
  local extra = g:param("extra.weight", {2, 2}, {trainable = false})
  local p = g:compile{outputs = {extra}}
  ok, err = try(checkpoint.load, p, "unet", single.unet, {extra})
  T.ok(not ok and one_line(err, SINGLE, "'extra.weight'", "unet"), "a parameter with no source: " .. tostring(err))
  -- a source missing from the file
  local desc = checkpoint.open(SINGLE, {unet_config = folder.unet_config})
  desc.unet.map["conv_in.weight"] = "model.diffusion_model.input_blocks.0.0.weights"
  local g2 = ck.graph()
  local w = g2:param("conv_in.weight", {4, 4, 3, 3}, {trainable = false})
  local p2 = g2:compile{outputs = {w}}
  ok, err = try(checkpoint.load, p2, "unet", desc.unet, {w})
  T.ok(not ok and one_line(err, SINGLE, "missing tensor 'model.diffusion_model.input_blocks.0.0.weights'"),
    "a source missing from the file: " .. tostring(err))
  -- a text projection loaded untransposed has the wrong shape
  local g3 = ck.graph()
  local tp = g3:param("text_projection.weight", {12, 8}, {trainable = false})
  local p3 = g3:compile{outputs = {tp}}
  ok, err = try(checkpoint.load, p3, "text_encoder_2", single.text_encoder_2, {tp})
  T.ok(not ok and one_line(err, SINGLE, "conditioner.embedders.1.model.text_projection' transposed has shape [8, 12]"),
    "a transposed source of the wrong shape: " .. tostring(err))

  -- a key under the UNet's prefix that no rule maps
  local id = {
    {"model.diffusion_model.input_blocks.0.0.weight", {4, 4, 3, 3}},
    {"model.diffusion_model.label_emb.0.0.weight", {16, 32}},
  }
  local function write(name, extra_entries)
    local entries = {}
    for _, e in ipairs(id) do
      local n = 1
      for _, d in ipairs(e[2]) do n = n * d end
      entries[#entries + 1] = {e[1], e[2], T.random_values(T.rng(1), n)}
    end
    for _, e in ipairs(extra_entries) do entries[#entries + 1] = e end
    ck.write_safetensors(path(name), entries)
    return path(name)
  end
  local stray = write("stray.safetensors", {{"model.diffusion_model.input_blocks.99.0.in_layers.0.weight", {1}, {0}}})
  ok, err = try(checkpoint.open, stray, {unet_config = folder.unet_config})
  T.ok(not ok and one_line(err, stray, "'model.diffusion_model.input_blocks.99.0.in_layers.0.weight' does not map"),
    "a UNet key that does not map: " .. tostring(err))
  local stray2 = write("stray2.safetensors", {{"first_stage_model.encoder.mid.attn_1.qkv.weight", {1}, {0}}})
  ok, err = try(checkpoint.open, stray2, {unet_config = folder.unet_config})
  T.ok(not ok and one_line(err, stray2, "'first_stage_model.encoder.mid.attn_1.qkv.weight' does not map"),
    "a VAE key that does not map: " .. tostring(err))
  local stray3 = write("stray3.safetensors", {{"model.diffusion_model.input_blocks.1.0.in_layers.1.weight", {1}, {0}}})
  ok, err = try(checkpoint.open, stray3, {unet_config = folder.unet_config})
  T.ok(not ok and one_line(err, stray3, "'model.diffusion_model.input_blocks.1.0.in_layers.1.weight' does not map"),
    "a resnet's inner name no rule knows: " .. tostring(err))

  -- keys that a rule maps to a name the model lacks, in every block type: refused, never skipped
  for _, k in ipairs{
    "model.diffusion_model.middle_block.1.foo.weight",                              -- an attention block's unknown inner name
    "model.diffusion_model.middle_block.1.transformer_blocks.9.attn1.to_q.weight",  -- a transformer block past the config's
    "model.diffusion_model.middle_block.1.transformer_blocks.0.attn3.to_q.weight",
    "model.diffusion_model.input_blocks.0.0.weight.extra",                          -- a plain module's
    "model.diffusion_model.input_blocks.1.0.in_layers.0.weight.extra",              -- a resnet's
    "model.diffusion_model.out.2.scale",
    "conditioner.embedders.0.transformer.text_model.foo.weight",                    -- CLIP-L's
    "conditioner.embedders.0.transformer.text_model.encoder.layers.99.mlp.fc1.weight",
    "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.bias",
    "conditioner.embedders.1.model.transformer.resblocks.99.ln_1.weight",           -- OpenCLIP's
    "first_stage_model.encoder.down.9.block.0.conv1.weight",                        -- the VAE's
    "first_stage_model.decoder.up.0.block.7.norm1.weight",
  } do
    local f = write("unknown.safetensors", {{k, {1}, {0}}})
    ok, err = try(checkpoint.open, f, {unet_config = folder.unet_config})
    T.ok(not ok and one_line(err, f, "'" .. k .. "'"), "an unknown key is refused naming it: " .. tostring(err))
  end

  -- configs checked by type, sign and range before anything is built
  for _, c in ipairs{
    {"transformer_layers_per_block", {1, -3}}, {"transformer_layers_per_block", 0}, {"layers_per_block", {2, 0}},
    {"layers_per_block", 1.5}, {"attention_head_dim", {2, "x"}}, {"block_out_channels", {32, -64}},
    {"norm_eps", -1e-5}, {"norm_eps", 0}, {"dropout", 1.5}, {"norm_num_groups", 0}, {"in_channels", 0},
    {"cross_attention_dim", "20"}, {"use_linear_projection", "yes"}, {"sample_size", -8},
    {"projection_class_embeddings_input_dim", 4},
  } do
    local raw = {}
    for k, v in pairs(folder.unet_config) do raw[k] = v end
    if type(c[2]) == "table" and #c[2] < #raw.block_out_channels then -- the list as long as the config's blocks
      local t = {}
      for i = 1, #raw.block_out_channels do t[i] = c[2][i] or c[2][#c[2]] end
      c[2] = t
    end
    raw[c[1]] = c[2]
    ok, err = try(checkpoint.unet_config, raw, "unet/config.json")
    T.ok(not ok and one_line(err, "unet/config.json", "'" .. c[1] .. "'"),
      "a UNet config's " .. c[1] .. " of " .. (type(c[2]) == "table" and ck.json_encode(c[2]) or tostring(c[2])) ..
      " is refused naming it: " .. tostring(err))
  end
  local vae = require "ck.vae"
  for _, c in ipairs{{"scaling_factor", -0.13}, {"scaling_factor", 0}, {"shift_factor", 0 / 0}, {"layers_per_block", 0},
                     {"mid_block_add_attention", "no"}, {"latent_channels", -4}, {"_class_name", "AutoencoderTiny"}} do
    local raw = vae.config("tiny")
    raw[c[1]] = c[2]
    ok, err = pcall(function() local r = vae.config(raw); return r end)
    T.ok(not ok and one_line(err, c[1]), "a VAE config's " .. c[1] .. " of " .. tostring(c[2]) .. " is refused: " .. tostring(err))
  end

  -- a folder's text encoder and VAE configs, checked naming their files
  for _, c in ipairs{{"text_encoder", "eos_token_id", -3}, {"text_encoder_2", "num_hidden_layers", -1},
                     {"text_encoder", "layer_norm_eps", 0}, {"vae", "scaling_factor", -1}, {"vae", "layers_per_block", 0}} do
    local dir2 = path("cfg_" .. c[1] .. "_" .. c[2])
    for _, part in ipairs{"unet", c[1]} do
      assert(ck.mkdir(dir2 .. "/" .. part))
      for _, n in ipairs(ck.listdir(FOLDER .. "/" .. part)) do
        local src = assert(io.open(FOLDER .. "/" .. part .. "/" .. n, "rb"))
        local bytes = src:read("a")
        src:close()
        if n == "config.json" and part == c[1] then
          local j = ck.json_decode(bytes)
          j[c[2]] = c[3]
          bytes = ck.json_encode(j)
        end
        local dst = assert(io.open(dir2 .. "/" .. part .. "/" .. n, "wb"))
        dst:write(bytes)
        dst:close()
      end
    end
    ok, err = try(checkpoint.open, dir2)
    T.ok(not ok and one_line(err, dir2 .. "/" .. c[1] .. "/config.json", c[2]),
      "a folder's " .. c[1] .. " config with " .. c[2] .. " " .. tostring(c[3]) .. " is refused naming it: " .. tostring(err))
    for _, part in ipairs{"unet", c[1]} do
      for _, n in ipairs(ck.listdir(dir2 .. "/" .. part)) do os.remove(dir2 .. "/" .. part .. "/" .. n) end
      os.remove(dir2 .. "/" .. part)
    end
    os.remove(dir2)
  end

  -- files that are not SDXL
  ok, err = try(checkpoint.open, folder.unet.file)
  T.ok(not ok and one_line(err, folder.unet.file, "not an SDXL checkpoint", "no model.diffusion_model.*"),
    "a file of diffusers names is not a single-file SDXL: " .. tostring(err))
  local sd1 = path("sd1.safetensors")
  ck.write_safetensors(sd1, {{"model.diffusion_model.input_blocks.0.0.weight", {4, 4, 3, 3},
    T.random_values(T.rng(2), 144)}})
  ok, err = try(checkpoint.open, sd1, {unet_config = folder.unet_config})
  T.ok(not ok and one_line(err, sd1, "not an SDXL checkpoint", "'model.diffusion_model.label_emb.0.0.weight'"),
    "a UNet without SDXL's text_time embedding (SD 1.x) is refused: " .. tostring(err))
  ok, err = try(checkpoint.open, SINGLE)
  T.ok(not ok and one_line(err, SINGLE, "not an SDXL checkpoint",
    "'model.diffusion_model.input_blocks.0.0.weight' has shape [4, 4, 3, 3], SDXL base has [320, 4, 3, 3]"),
    "with no config the file must be SDXL base's size: " .. tostring(err))
  id[2][2] = {16, 33}
  local wrong = write("wrong.safetensors", {})
  ok, err = try(checkpoint.open, wrong, {unet_config = folder.unet_config})
  T.ok(not ok and one_line(err, wrong,
    "'model.diffusion_model.label_emb.0.0.weight' has shape [16, 33], the given UNet config has [16, 32]"),
    "the wrong shape of an identifying key: " .. tostring(err))

  -- a truncated file
  local src = assert(io.open(SINGLE, "rb"))
  local bytes = src:read("a")
  src:close()
  local cut = path("truncated.safetensors")
  local o = assert(io.open(cut, "wb"))
  o:write(bytes:sub(1, #bytes - 1000))
  o:close()
  ok, err = try(checkpoint.open, cut, {unet_config = folder.unet_config})
  T.ok(not ok and one_line(err, cut), "a truncated file: " .. tostring(err))

  -- a folder's weight names: plain first, the fp16 variant when asked; none is an error naming the folder
  local dir = path("folder")
  assert(ck.mkdir(dir .. "/unet"))
  local cfg_in = assert(io.open(FOLDER .. "/unet/config.json", "rb"))
  local cfg_out = assert(io.open(dir .. "/unet/config.json", "wb"))
  cfg_out:write(cfg_in:read("a"))
  cfg_in:close()
  cfg_out:close()
  ok, err = try(checkpoint.open, dir)
  T.ok(not ok and one_line(err, dir .. "/unet", "no weights", "diffusion_pytorch_model.safetensors"),
    "a folder part without weights: " .. tostring(err))
  local a, b = "conv_in.weight", "conv_out.weight"
  ck.write_safetensors(dir .. "/unet/diffusion_pytorch_model.safetensors", {{a, {1}, {1}}})
  ck.write_safetensors(dir .. "/unet/diffusion_pytorch_model.fp16.safetensors", {{b, {1}, {2}}}, nil, "F16")
  local plain, fp16 = checkpoint.open(dir), checkpoint.open(dir, {variant = "fp16"})
  T.ok(plain.unet.map[a] == a and plain.unet.map[b] == nil and fp16.unet.map[b] == b and fp16.unet.map[a] == nil
    and plain.vae == nil and plain.tokenizer == nil,
    "plain weights by default, *.fp16.safetensors with variant = fp16; absent parts stay nil")
  -- a folder's tensor that is no parameter of its config's model is refused, not skipped
  for _, k in ipairs{"mystery.weight", "down_blocks.9.resnets.0.conv1.weight", "conv_in.weight.extra",
                     "mid_block.attentions.0.transformer_blocks.7.attn1.to_q.weight"} do
    ck.write_safetensors(dir .. "/unet/diffusion_pytorch_model.safetensors", {{a, {1}, {1}}, {k, {1}, {1}}})
    ok, err = try(checkpoint.open, dir)
    T.ok(not ok and one_line(err, dir .. "/unet/diffusion_pytorch_model.safetensors", "'" .. k .. "'", "does not have"),
      "a folder's unknown UNet tensor is refused: " .. tostring(err))
  end
  for _, n in ipairs(ck.listdir(dir .. "/unet")) do os.remove(dir .. "/unet/" .. n) end
  os.remove(dir .. "/unet")
  os.remove(dir)

  -- not a folder of SDXL, and configs ck.unet cannot build
  ok, err = try(checkpoint.open, FOLDER .. "/vae")
  T.ok(not ok and one_line(err, FOLDER .. "/vae", "no unet/config.json"), "a folder without a UNet: " .. tostring(err))
  local cfg = checkpoint.unet_config(folder.unet_config)
  cfg.down_block_types[1] = "AttnDownBlock2D"
  ok, err = try(checkpoint.unet_config, cfg, "unet/config.json")
  T.ok(not ok and one_line(err, "unet/config.json", "'down_block_types'", "AttnDownBlock2D"),
    "a block type ck.unet lacks: " .. tostring(err))
  cfg = checkpoint.unet_config(folder.unet_config)
  cfg.mid_block_type = "UNetMidBlock2D"
  ok, err = try(checkpoint.unet_config, cfg, "unet/config.json")
  T.ok(not ok and one_line(err, "unet/config.json", "'mid_block_type'", "UNetMidBlock2D"),
    "a mid block ck.unet lacks: " .. tostring(err))
  local raw = {}
  for k, v in pairs(folder.unet_config) do raw[k] = v end
  raw.class_embed_type = "timestep"
  ok, err = try(checkpoint.unet_config, raw, "unet/config.json")
  T.ok(not ok and one_line(err, "unet/config.json", "'class_embed_type'"), "a class embedding: " .. tostring(err))
  T.ok(checkpoint.unet_config(folder.unet_config).num_attention_heads == nil,
    "JSON nulls are dropped (num_attention_heads falls back to attention_head_dim)")
end

for _, f in pairs(files) do f:close() end
for _, name in ipairs(ck.listdir(tmp)) do os.remove(path(name)) end
os.remove(tmp)
T.done()
