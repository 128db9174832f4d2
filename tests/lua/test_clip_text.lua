-- ck.clip, SDXL's two text encoders: small random CLIPTextModel and
-- CLIPTextModelWithProjection models (tests/ref/make_clip_ref.py, loaded from
-- their diffusers-folder files) give transformers' hidden_states[-2],
-- last_hidden_state and pooled / text_embeds within 1e-4, under both rules for
-- the pooled token; clip.sdxl gives diffusers' encode_prompt; attention is
-- causal with exact zeros; the full configs' parameters are transformers' keys
-- and shapes; bad ids, configs and files are errors that name what is wrong.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local clip = require "ck.clip"

local DATA = "tests/data/clip/"
local ref <close> = ck.safetensors(DATA .. "outputs.safetensors")

local function json_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return ck.json_decode(s)
end

local cfg_l = clip.config(json_file(DATA .. "text_encoder/config.json"))
local cfg_g = clip.config(json_file(DATA .. "text_encoder_2/config.json"))

-- max over elements of |got - want| / max(1, |want|), and whether it is within tol
local function close(got, want, tol)
  if #got ~= #want then return false, math.huge end
  local e = 0
  for i = 1, #want do
    local d = math.abs(got[i] - want[i]) / math.max(1, math.abs(want[i]))
    if not (d <= e) then e = d end -- NaN counts as the worst
  end
  return e <= tol, e
end

local function compare(p, t, key, what, tol)
  tol = tol or 1e-4
  local ok, e = close(p:get(t), ref:read(key), tol)
  T.ok(ok, string.format("%s equals transformers' %s within %g (rel err %.2e)", what, key, tol, e))
end

do -- the config.json tables: transformers' keys, checked
  T.ok(cfg_l.num_hidden_layers == 3 and cfg_l.hidden_act == "quick_gelu" and cfg_l.eos_token_id == 2
    and cfg_g.num_hidden_layers == 2 and cfg_g.hidden_act == "gelu" and cfg_g.projection_dim == 48,
    "the reference configs read from config.json (3 layers quick_gelu; 2 layers gelu, projection 48)")
end

do -- CLIPTextModel (text_encoder): penultimate, last hidden state, pooled output
  local g = ck.graph()
  local enc, r = clip.build(g, cfg_l, {batch = 4})
  T.ok(enc.text_projection == nil and table.concat(r.pooled.shape, ",") == "4,32",
    "CLIPTextModel's config builds no projection: pooled is [4, 32]")
  local w = enc.layers[1].self_attn.weights
  local p = g:compile{outputs = {r.hidden_penultimate, r.last_hidden_state, r.pooled, w}}
  clip.load(p, enc, DATA .. "text_encoder/model.safetensors")
  enc:feed(p, ref:read("ids_l"))
  p:forward()
  compare(p, r.hidden_penultimate, "l.hidden_penultimate", "text_encoder hidden_states[-2]")
  compare(p, r.last_hidden_state, "l.last_hidden_state", "text_encoder last_hidden_state")
  compare(p, r.pooled, "l.pooler_output", "text_encoder pooler_output (the EOS row, padding with EOS)")

  -- attention weights [4, 4, 77, 77] of layer 0: exactly 0 above the diagonal, rows summing to 1
  local v = p:get(w)
  local above, worst = 0, 0
  for row = 0, 4 * 4 * 77 - 1 do
    local i, s = row % 77, 0
    for j = 0, 76 do
      local x = v[row * 77 + j + 1]
      if j > i and x ~= 0 then above = above + 1 end
      s = s + x
    end
    worst = math.max(worst, math.abs(s - 1))
  end
  T.ok(above == 0 and worst < 1e-5,
    string.format("attention is causal: %d weights above the diagonal are not exactly 0; rows sum to 1 within %.1e",
                  above, worst))

  -- causal: changing a later token leaves every earlier position's output bitwise as it was
  local before = p:get(r.hidden_penultimate)
  local ids = ref:read("ids_l")
  ids[77 * 3 + 20] = 123 -- row 4, position 19 (0-based)
  enc:feed(p, ids)
  p:forward()
  local after = p:get(r.hidden_penultimate)
  local same, changed = true, false
  for pos = 0, 76 do
    for c = 1, 32 do
      local k = (3 * 77 + pos) * 32 + c
      if pos < 19 and after[k] ~= before[k] then same = false end
      if pos >= 19 and after[k] ~= before[k] then changed = true end
    end
  end
  T.ok(same and changed, "a token changed at position 19 changes positions 19 on and leaves 0 to 18 bitwise alone")
end

do -- CLIPTextModelWithProjection (text_encoder_2): penultimate, last, text_embeds (padding with 0)
  local g = ck.graph()
  local enc, r = clip.build(g, cfg_g, {batch = 4})
  T.ok(enc.text_projection ~= nil and table.concat(r.pooled.shape, ",") == "4,48",
    "CLIPTextModelWithProjection's config builds text_projection: pooled is [4, 48]")
  local p = g:compile{outputs = {r.hidden_penultimate, r.last_hidden_state, r.pooled}}
  clip.load(p, enc, DATA .. "text_encoder_2/model.safetensors")
  enc:feed(p, ref:read("ids_g"))
  p:forward()
  compare(p, r.hidden_penultimate, "g.hidden_penultimate", "text_encoder_2 hidden_states[-2]")
  compare(p, r.last_hidden_state, "g.last_hidden_state", "text_encoder_2 last_hidden_state")
  compare(p, r.pooled, "g.text_embeds", "text_encoder_2 text_embeds")

  -- bf16 storage: the same graph with activations and frozen weights in bf16
  local gb = ck.graph()
  local encb, rb = clip.build(gb, cfg_g, {batch = 4})
  local pb = gb:compile{outputs = {rb.pooled}, storage = "bf16"}
  clip.load(pb, encb, DATA .. "text_encoder_2/model.safetensors")
  encb:feed(pb, ref:read("ids_g"))
  pb:forward()
  compare(pb, rb.pooled, "g.text_embeds", "text_encoder_2 text_embeds in bf16 storage", 0.05)
end

do -- the first-EOS rule (eos_token_id other than 2): a higher id before the first EOS
  local c = clip.config(json_file(DATA .. "text_encoder_2/config.json"))
  c.eos_token_id = 300
  local ids = ref:read("ids_first")
  local row2 = table.move(ids, 78, 154, 1, {})
  T.ok(clip.eos_position(row2, 300) == 10 and clip.eos_position(row2, 2) == 0,
    "the pooled position: the first 300 (10) under eos_token_id 300, the first largest id (510 at 0) under the legacy 2")
  local g = ck.graph()
  local enc, r = clip.build(g, c, {batch = 2})
  local p = g:compile{outputs = {r.pooled}}
  clip.load(p, enc, DATA .. "text_encoder_2/model.safetensors")
  enc:feed(p, ids)
  p:forward()
  compare(p, r.pooled, "g.text_embeds_first", "text_embeds under eos_token_id 300")
end

do -- clip.sdxl: diffusers' StableDiffusionXLPipeline.encode_prompt
  local g = ck.graph()
  local te = clip.sdxl(g, cfg_l, cfg_g, {batch = 4})
  T.ok(table.concat(te.prompt_embeds.shape, ",") == "4,77,64" and table.concat(te.pooled.shape, ",") == "4,48",
    "prompt_embeds [4, 77, 32 + 32], pooled [4, 48]")
  local names = {}
  for _, prm in ipairs(g:params()) do names[prm.name] = prm.kind end
  T.ok(names["text_encoder.text_model.embeddings.token_embedding.weight"] == "frozen"
    and names["text_encoder_2.text_projection.weight"] == "frozen"
    and names["text_encoder.text_model.encoder.layers.1.mlp.fc2.bias"] ~= nil
    and names["text_encoder.text_model.encoder.layers.2.mlp.fc2.bias"] == nil
    and names["text_encoder.text_model.final_layer_norm.weight"] == nil,
    "parameters under text_encoder. and text_encoder_2., frozen; text_encoder builds only the layers its penultimate output needs")
  local p = g:compile{outputs = {te.prompt_embeds, te.pooled}}
  clip.load(p, te.l, DATA .. "text_encoder/model.safetensors")
  clip.load(p, te.g, DATA .. "text_encoder_2/model.safetensors")
  te:feed(p, ref:read("ids_l"), ref:read("ids_g"))
  p:forward()
  compare(p, te.prompt_embeds, "sdxl.prompt_embeds", "clip.sdxl prompt_embeds")
  compare(p, te.pooled, "sdxl.pooled_prompt_embeds", "clip.sdxl pooled")
end

do -- clip_skip 1: hidden_states[-3] of both encoders, as encode_prompt(clip_skip=1)
  local g = ck.graph()
  local te = clip.sdxl(g, cfg_l, cfg_g, {batch = 2, clip_skip = 1})
  local p = g:compile{outputs = {te.prompt_embeds}}
  clip.load(p, te.l, DATA .. "text_encoder/model.safetensors")
  clip.load(p, te.g, DATA .. "text_encoder_2/model.safetensors")
  te:feed(p, table.move(ref:read("ids_l"), 1, 154, 1, {}), table.move(ref:read("ids_g"), 1, 154, 1, {}))
  p:forward()
  compare(p, te.prompt_embeds, "sdxl.prompt_embeds_clip_skip_1", "clip.sdxl{clip_skip = 1} prompt_embeds")
  local ok, err = pcall(clip.sdxl, ck.graph(), cfg_l, cfg_g, {clip_skip = 2})
  T.ok(not ok and err:find("clip_skip must be", 1, true), "clip_skip past text_encoder_2's layers: " .. tostring(err))
end

do -- 16 tokens: causal, so each position's output is that of the 77-token run
  local g = ck.graph()
  local enc, r = clip.build(g, cfg_l, {batch = 4, tokens = 16, layers_needed = "penultimate"})
  T.ok(r.pooled == nil and enc.final_layer_norm == nil, "layers_needed = \"penultimate\" builds no final layer norm")
  local p = g:compile{outputs = {r.hidden_penultimate}}
  clip.load(p, enc, DATA .. "text_encoder/model.safetensors")
  local ids, want, full = ref:read("ids_l"), {}, ref:read("l.hidden_penultimate")
  local rows = {}
  for b = 0, 3 do
    rows[b + 1] = table.move(ids, b * 77 + 1, b * 77 + 16, 1, {})
    table.move(full, b * 77 * 32 + 1, (b * 77 + 16) * 32, b * 16 * 32 + 1, want)
  end
  enc:feed(p, rows)
  p:forward()
  local ok, e = close(p:get(r.hidden_penultimate), want, 1e-4)
  T.ok(ok, string.format("16 tokens give the first 16 positions of transformers' hidden_states[-2] (rel err %.2e)", e))
end

-- "name [d0,d1,...]" per line -> {name = "d0,d1,..."}, count, parameters
local function read_keys(path)
  local keys, n, numel = {}, 0, 0
  for line in io.lines(path) do
    local name, shape = line:match("^(%S+)%s+%[([%d,]*)%]%s*$")
    if name then
      keys[name] = shape
      n = n + 1
      local m = 1
      for d in shape:gmatch("%d+") do m = m * tonumber(d) end
      numel = numel + m
    end
  end
  return keys, n, numel
end

local function check_keys(config, path, what)
  local want, nwant, numel = read_keys(path)
  local g = ck.graph()
  clip.build(g, config, {batch = 1})
  local diffs, nhave = {}, 0
  for _, prm in ipairs(g:params()) do
    nhave = nhave + 1
    local s = table.concat(prm.shape, ",")
    if want[prm.name] ~= s and #diffs < 3 then diffs[#diffs + 1] = prm.name .. " [" .. s .. "]" end
  end
  local total = g:param_count()
  T.ok(#diffs == 0 and nhave == nwant and total == numel,
    string.format("%s: %d parameters in %d tensors, as transformers' %d in %d (%s)%s", what, total, nhave, numel,
                  nwant, path, #diffs > 0 and ": " .. table.concat(diffs, ", ") or ""))
end

check_keys("sdxl-l", DATA .. "sdxl_l_keys.txt", "sdxl-l (CLIPTextModel, ViT-L/14)")
check_keys("sdxl-g", DATA .. "sdxl_g_keys.txt", "sdxl-g (CLIPTextModelWithProjection, ViT-bigG/14)")

do -- tiny-l and tiny-g fit the sdxl-tiny UNet's conditioning
  local unet, sdxl = require "ck.unet", require "ck.sdxl"
  local u = unet.config("sdxl-tiny")
  local g = ck.graph()
  local te = clip.sdxl(g, "tiny-l", "tiny-g", {batch = 2})
  T.ok(te.prompt_embeds.shape[3] == u.cross_attention_dim and te.pooled.shape[2] == sdxl.pooled_dim(u),
    string.format("tiny-l + tiny-g give [2, 77, %d] and [2, %d]: the sdxl-tiny UNet's cross_attention_dim and pooled width",
                  te.prompt_embeds.shape[3], te.pooled.shape[2]))
end

do -- errors name what is wrong
  local ok, err = pcall(clip.config, "sdxl-h")
  T.ok(not ok and err:find("unknown config 'sdxl-h'", 1, true), "an unknown config name: " .. tostring(err))
  ok, err = pcall(clip.config, {hidden_size = 30, num_attention_heads = 4})
  T.ok(not ok and err:find("hidden_size 30 is not a multiple of num_attention_heads 4", 1, true),
    "heads that do not divide the width: " .. tostring(err))
  ok, err = pcall(clip.config, {hidden_act = "relu"})
  T.ok(not ok and err:find("hidden_act 'relu'", 1, true), "an activation CLIP does not use: " .. tostring(err))

  local g = ck.graph()
  local enc, r = clip.build(g, cfg_l, {batch = 2})
  local p = g:compile{outputs = {r.pooled}}
  clip.load(p, enc, DATA .. "text_encoder/model.safetensors")
  local ids = ref:read("ids_l")
  local two = table.move(ids, 1, 154, 1, {})
  two[77 + 5] = 512
  ok, err = pcall(function() enc:feed(p, two) end)
  T.ok(not ok and err:find("test_clip_text.lua:%d+: clip: row 2 position 5: 512 is not a token id %(0 to 511%)"),
    "feeding an id past the vocabulary names the row, the position and the line: " .. tostring(err))
  ok, err = pcall(function() enc:feed(p, {two}) end)
  T.ok(not ok and err:find("1 rows of ids for a batch of 2", 1, true), "a wrong row count: " .. tostring(err))

  -- ids set around feed reach the embedding op, which stops the run and names the op and the building line
  enc:feed(p, table.move(ids, 1, 154, 1, {}))
  two[77 + 5] = 600
  p:set(enc.inputs.input_ids, two)
  ok, err = pcall(p.forward, p)
  T.ok(not ok and err:find("test_clip_text.lua:%d+: embedding in text_model.embeddings.token_embedding on ") and
    err:find("id 600 at index 81 is not a row of the [512, 32] table", 1, true),
    "an id past the table at run time: " .. tostring(err))
  enc:feed(p, table.move(ids, 1, 154, 1, {}))
  ok = pcall(p.forward, p)
  T.ok(ok, "the program runs again once the ids are good")

  -- a file for the other encoder: its missing key is named
  local g2 = ck.graph()
  local enc2, r2 = clip.build(g2, cfg_g, {batch = 1})
  local p2 = g2:compile{outputs = {r2.pooled}}
  ok, err = pcall(clip.load, p2, enc2, DATA .. "text_encoder/model.safetensors")
  T.ok(not ok and err:find("text_projection.weight", 1, true), "loading text_encoder's file into text_encoder_2 names "
    .. "the key it lacks: " .. tostring(err))
  ok, err = pcall(clip.load, p2, enc2, DATA .. "no_such_dir/model.safetensors")
  T.ok(not ok and err:find("no_such_dir/model.safetensors", 1, true), "a missing file is named: " .. tostring(err))
end

T.done()
