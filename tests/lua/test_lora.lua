-- LoRA on the SDXL UNet (ck.lora): which Linears get adapters, how many
-- parameters they add, the kohya and PEFT names, that a fresh adapter leaves the
-- output unchanged, and that training moves only the adapters of a frozen base.
-- With conv_rank (kohya's LoCon): which convolutions get adapters at which
-- rank, their alphas in the file, and their gradients against finite differences.
-- With dropout (kohya's network_dropout): training passes drop lora_down's
-- outputs, evaluation passes do not, and the gradients follow the mask. With
-- loraplus_lr_ratio (LoRA+): lora_up learns at that multiple of the rate.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local lora = require "ck.lora"

local DEFAULT = {to_q = true, to_k = true, to_v = true, ["to_out.0"] = true}
local KOHYA = {to_q = true, to_k = true, to_v = true, ["to_out.0"] = true, ["ff.net.0.proj"] = true,
               ["ff.net.2"] = true, proj_in = true, proj_out = true}

-- from a key list: the number of targeted Linear weights and rank * (in + out) summed over them
local function expected(path, targets, rank)
  local n, count = 0, 0
  for line in io.lines(path) do
    local module, o, i = line:match("^(%S+)%.weight%s+%[(%d+),(%d+)%]%s*$")
    if module then
      for t in pairs(targets) do
        if module:sub(-#t - 1) == "." .. t then
          n = n + 1
          count = count + rank * (tonumber(i) + tonumber(o))
          break
        end
      end
    end
  end
  return n, count
end

do -- defaults on sdxl-tiny: adapters on every to_q/to_k/to_v/to_out.0, rank 4
  local want_n, want_count = expected("tests/data/sdxl_tiny_keys.txt", DEFAULT, 4)
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  local h = lora.attach(model)
  T.ok(#h.paths == want_n, string.format("default targets adapt %d modules (want %d)", #h.paths, want_n))
  T.ok(h.rank == 4 and h.alpha == 4 and h.scale == 1, "defaults: rank 4, alpha 4, scale 1")
  local g = ck.graph()
  unet.build(g, model, {frozen = true})
  local all, train = g:param_count()
  T.ok(train == want_count and h.param_count() == want_count,
    string.format("rank-4 adapters add %d trainable parameters (want %d)", train, want_count))
  T.ok(all == 8011332 + want_count, "base parameters stay in the graph, frozen")
  local down = g:get("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.lora_down.weight")
  local up = g:get("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.lora_up.weight")
  T.ok(down and up and table.concat(down.shape, ",") == "4,64" and table.concat(up.shape, ",") == "64,4"
    and down.kind == "param" and up.kind == "param",
    "to_q gets lora_down [4,64] and lora_up [64,4], both trainable")
  local base = g:get("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight")
  T.ok(base and base.kind == "frozen", "the base to_q weight is frozen")
end

do -- kohya targets: every Linear inside each Transformer2DModel
  local want_n, want_count = expected("tests/data/sdxl_tiny_keys.txt", KOHYA, 8)
  local h = lora.attach(unet.UNet2DConditionModel("sdxl-tiny"), {rank = 8, alpha = 4, targets = "kohya"})
  T.ok(#h.paths == want_n and h.param_count() == want_count,
    string.format("kohya targets adapt %d modules with %d parameters at rank 8 (want %d, %d)",
      #h.paths, h.param_count(), want_n, want_count))
  T.ok(h.scale == 0.5, "alpha 4 at rank 8 scales by 0.5")
  local outside = false
  for _, p in ipairs(h.paths) do
    if not p:find("%.attentions%.%d+%.") then outside = true end
  end
  T.ok(not outside, "no adapter outside a Transformer2DModel (time embeddings, resnets)")
end

do -- full sdxl (tree only): the counts the reference gives
  local h = lora.attach(unet.UNet2DConditionModel("sdxl"))
  T.ok(h.param_count() == 5806080, "sdxl default targets at rank 4: 5806080 parameters (" .. h.param_count() .. ")")
  local k = lora.attach(unet.UNet2DConditionModel("sdxl"), {rank = 1, targets = "kohya"})
  T.ok(k.param_count() == 2659840, "sdxl kohya targets: 2659840 parameters per unit of rank (" .. k.param_count() .. ")")
  local seen, bad = {}, nil
  for _, p in ipairs(k.paths) do
    local name = lora.kohya_name(p)
    if seen[name] then bad = name end
    seen[name] = true
  end
  T.ok(bad == nil, "kohya names of the " .. #k.paths .. " sdxl adapters are distinct" .. (bad and (": " .. bad) or ""))
end

do -- kohya and PEFT names
  local cases = {
    {"down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"},
    {"down_blocks.1.attentions.1.proj_in", "lora_unet_input_blocks_5_1_proj_in"},
    {"down_blocks.2.attentions.1.transformer_blocks.9.ff.net.0.proj",
     "lora_unet_input_blocks_8_1_transformer_blocks_9_ff_net_0_proj"},
    {"mid_block.attentions.0.transformer_blocks.3.attn2.to_out.0",
     "lora_unet_middle_block_1_transformer_blocks_3_attn2_to_out_0"},
    {"up_blocks.0.attentions.2.proj_in", "lora_unet_output_blocks_2_1_proj_in"},
    {"up_blocks.1.attentions.0.transformer_blocks.1.ff.net.2", "lora_unet_output_blocks_3_1_transformer_blocks_1_ff_net_2"},
    {"conv_in", "lora_unet_input_blocks_0_0"},
    {"down_blocks.0.resnets.1.conv1", "lora_unet_input_blocks_2_0_in_layers_2"},
    {"down_blocks.1.downsamplers.0.conv", "lora_unet_input_blocks_6_0_op"},
    {"mid_block.resnets.1.time_emb_proj", "lora_unet_middle_block_2_emb_layers_1"},
    {"up_blocks.2.resnets.0.conv_shortcut", "lora_unet_output_blocks_6_0_skip_connection"},
    {"up_blocks.0.upsamplers.0.conv", "lora_unet_output_blocks_2_2_conv"},
    {"time_embedding.linear_1", "lora_unet_time_embed_0"},
    {"add_embedding.linear_2", "lora_unet_label_emb_0_2"},
  }
  for _, c in ipairs(cases) do
    local got = lora.kohya_name(c[1])
    T.ok(got == c[2], c[1] .. " -> " .. c[2] .. (got ~= c[2] and (" (got " .. got .. ")") or ""))
  end
  T.ok(lora.peft_name("mid_block.attentions.0.proj_out") == "unet.mid_block.attentions.0.proj_out",
    "PEFT name is unet.<diffusers path>")
  T.ok(not pcall(lora.kohya_name, "not_a_block.proj_in"), "a path with no SGM name is an error")
end

do -- LoCon: conv_rank adapts what kohya's conv_dim does, counted from the key list
  -- the default (attention) targets at rank 4, and every weight of a module
  -- directly inside a resnet, downsampler or upsampler: 3x3 at rank 2, others at 4
  local want_n, want_count = expected("tests/data/sdxl_tiny_keys.txt", DEFAULT, 4)
  local want_conv = 0
  local blocks = {"%.resnets%.%d+%.[^.]+$", "%.downsamplers%.%d+%.conv$", "%.upsamplers%.%d+%.conv$"}
  for line in io.lines("tests/data/sdxl_tiny_keys.txt") do
    local module, shape = line:match("^(%S+)%.weight%s+%[([%d,]+)%]%s*$")
    local dims = {}
    for d in (shape or ""):gmatch("%d+") do dims[#dims + 1] = tonumber(d) end
    local in_block = false
    for _, b in ipairs(blocks) do in_block = in_block or (module ~= nil and module:find(b) ~= nil) end
    if in_block and (#dims == 4 or #dims == 2) then -- GroupNorm weights are 1-d
      local k = dims[3] or 1
      want_n, want_count = want_n + 1, want_count + (k > 1 and 2 or 4) * (dims[2] * k * k + dims[1])
      if k > 1 then want_conv = want_conv + 1 end
    end
  end
  local h = lora.attach(unet.UNet2DConditionModel("sdxl-tiny"), {conv_rank = 2, conv_alpha = 1})
  local conv3, shortcut, emb = 0, nil, nil
  for _, a in ipairs(h.adapters) do
    if a.kind == "conv" and a.kernel == 3 then
      conv3 = conv3 + 1
      assert(a.rank == 2 and a.alpha == 1)
    end
    if a.path:match("conv_shortcut$") then shortcut = a end
    if a.path:match("time_emb_proj$") then emb = a end
  end
  T.ok(#h.paths == want_n and h.param_count() == want_count and conv3 == want_conv,
    string.format("conv_rank 2: %d modules (%d 3x3 convolutions at rank 2), %d parameters (want %d, %d, %d)",
      #h.paths, conv3, h.param_count(), want_n, want_conv, want_count))
  T.ok(shortcut and shortcut.rank == 4 and shortcut.kind == "conv" and emb and emb.rank == 4 and emb.kind == "linear",
    "inside resnets, the 1x1 conv_shortcut and the time_emb_proj Linear take the linear rank, as kohya's")
  local alphas = {}
  for _, e in ipairs(lora.entries(h)) do
    if e.value then alphas[e[1]] = e.value end
  end
  T.ok(alphas["lora_unet_input_blocks_1_0_in_layers_2.alpha"] == 1 and alphas["lora_unet_input_blocks_3_0_op.alpha"] == 1
    and alphas["lora_unet_input_blocks_1_0_emb_layers_1.alpha"] == 4,
    "kohya names: 3x3 convolutions (in_layers.2, the downsampler's op) hold conv_alpha, the others alpha")
end

-- sdxl-tiny with small deterministic inputs and a target; returns program, output, inputs
local function tiny(g, model, frozen, compile)
  local _, y, x = unet.build(g, model, {batch = 1, height = 16, width = 16, frozen = frozen})
  local target = g:input("target", {1, 4, 16, 16})
  local p = g:compile(compile and compile(ck.mse_loss(y, target), y) or
                      {loss = ck.mse_loss(y, target), outputs = {y}, optimizer = "adamw", lr = 1e-3, seed = 11})
  local r = T.rng(3)
  for _, t in ipairs{x.sample, x.encoder_hidden_states, x.text_embeds, target} do
    p:set(t, T.random_values(r, t.numel, -1, 1))
  end
  p:set(x.timesteps, {250})
  p:set(x.time_ids, {16, 16, 0, 0, 16, 16})
  return p, y
end

-- the worst error of central differences (eps 1e-2) of p's loss against the
-- gradient gr of parameter name at entries idx, in units of the tolerance
-- 1e-4 + 3% of the larger; forward passes after step s draw step s's dropout masks
local function fd_worst(p, name, gr, idx)
  local EPS, worst, w = 1e-2, 0, p:get(name)
  for _, i in ipairs(idx) do
    local v = w[i]
    w[i] = v + EPS
    p:set(name, w)
    local lp = p:forward()
    w[i] = v - EPS
    p:set(name, w)
    local lm = p:forward()
    w[i] = v
    p:set(name, w)
    local num = (lp - lm) / (2 * EPS)
    worst = math.max(worst, math.abs(num - gr[i]) / (1e-4 + 3e-2 * math.max(math.abs(num), math.abs(gr[i]))))
  end
  return worst
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

do -- a fresh adapter (lora_up = 0) leaves the output bit-for-bit unchanged; a step moves only LoRA weights
  local pb, yb = tiny(ck.graph(), unet.UNet2DConditionModel("sdxl-tiny"), true)
  local lb = pb:forward()
  local base_out = pb:get(yb)

  local model = unet.UNet2DConditionModel("sdxl-tiny")
  lora.attach(model, {targets = "kohya"})
  local g = ck.graph()
  local p, y = tiny(g, model, true)
  local l0 = p:forward()
  T.ok(same(p:get(y), base_out) and l0 == lb, "with lora_up zero the output equals the base model's exactly")

  local _, train = g:param_count()
  local only_lora = true
  for _, t in ipairs(g:params()) do
    local is_lora = t.name:find("%.lora_[a-z]+%.weight$") ~= nil
    if (t.kind == "param") ~= is_lora then only_lora = false end
  end
  T.ok(only_lora and train > 0, "with the base frozen only LoRA parameters are trainable (" .. train .. ")")

  local up_name = "up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_v.lora_up.weight"
  local w_name = "up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_v.weight"
  local conv_name = "down_blocks.0.resnets.0.conv1.weight"
  local up0, w0, c0 = p:get(up_name), p:get(w_name), p:get(conv_name)
  p:step()
  local up1, w1, c1 = p:get(up_name), p:get(w_name), p:get(conv_name)
  local moved = 0
  for i = 1, #up0 do
    if up0[i] ~= up1[i] then moved = moved + 1 end
  end
  T.ok(moved > 0, string.format("one step changes lora_up (%d of %d values)", moved, #up0))
  T.ok(same(w0, w1) and same(c0, c1), "one step leaves the base weights unchanged")
  local l1 = p:forward()
  T.ok(l1 ~= l0, string.format("the loss moves after the step (%.6f -> %.6f)", l0, l1))
end

do -- LoCon: fresh conv adapters leave the output unchanged; their gradients match finite differences
  local pb, yb = tiny(ck.graph(), unet.UNet2DConditionModel("sdxl-tiny"), true)
  pb:forward()
  local base_out = pb:get(yb)
  local model = unet.UNet2DConditionModel("sdxl-tiny")
  lora.attach(model, {conv_rank = 2, conv_alpha = 1})
  local p, y = tiny(ck.graph(), model, true, function(loss, y)
    return {loss = loss, outputs = {y}, optimizer = "none", keep_grads = true, seed = 11}
  end)
  p:forward()
  T.ok(same(p:get(y), base_out), "fresh LoCon adapters leave the output equal to the base model's")
  -- nonzero ups, so that the downs have gradients: a stride-2 downsampler, an
  -- upsampler, a resnet's 3x3 conv and its 1x1 shortcut
  local r = T.rng(5)
  local mods = {"down_blocks.0.downsamplers.0.conv", "up_blocks.0.upsamplers.0.conv", "down_blocks.1.resnets.0.conv1",
                "down_blocks.1.resnets.0.conv_shortcut"}
  for _, m in ipairs(mods) do
    local n = #p:get(m .. ".lora_up.weight")
    p:set(m .. ".lora_up.weight", T.random_values(r, n, -0.5, 0.5))
  end
  p:step()
  local grads = {} -- all read before a forward pass reuses their memory
  for _, m in ipairs(mods) do
    for _, which in ipairs{"lora_down", "lora_up"} do grads[m .. "." .. which] = p:grad(m .. "." .. which .. ".weight") end
  end
  local worst = 0
  for _, m in ipairs(mods) do
    for _, which in ipairs{"lora_down", "lora_up"} do
      local gr = grads[m .. "." .. which]
      worst = math.max(worst, fd_worst(p, m .. "." .. which .. ".weight", gr, {1, 5, #gr}))
    end
  end
  T.ok(worst <= 1, string.format("conv adapters' gradients (downs and ups of 4 modules) match central differences "
    .. "(worst error %.2f of the tolerance 1e-4 + 3%%)", worst))
end

do -- LoRA+: after one AdamW step, lora_up is bitwise that of a 4x rate, lora_down that of the rate itself
  local function stepped(ratio, lr)
    local model = unet.UNet2DConditionModel("sdxl-tiny")
    lora.attach(model, {loraplus_lr_ratio = ratio})
    local g = ck.graph()
    local p = tiny(g, model, true, function(loss, y)
      return {loss = loss, outputs = {y}, optimizer = "adamw", lr = lr, weight_decay = 0.1, seed = 11}
    end)
    p:step()
    local ups, downs = {}, {}
    for _, t in ipairs(g:params()) do
      if t.name:match("lora_up") then ups[#ups + 1] = p:checksum(t.name) end
      if t.name:match("lora_down") then downs[#downs + 1] = p:checksum(t.name) end
    end
    return table.concat(ups, " "), table.concat(downs, " ")
  end
  local ua, da = stepped(4, 1e-3)
  local ub, db = stepped(1, 4e-3)
  local uc, dc = stepped(1, 1e-3)
  T.ok(ua == ub and ua ~= uc and da == dc and da ~= db,
    "loraplus_lr_ratio 4: lora_up moves as at 4x the rate, lora_down (weight decay only, its gradient is 0) as at the rate")
end

do -- network dropout
  local function build(dropout)
    local model = unet.UNet2DConditionModel("sdxl-tiny")
    lora.attach(model, {dropout = dropout})
    local g = ck.graph()
    local p = tiny(g, model, true, function(loss, y)
      return {loss = loss, outputs = {y}, optimizer = "none", keep_grads = true, seed = 11}
    end)
    local r = T.rng(8) -- the same nonzero ups in every program, so that the adapters matter
    for _, t in ipairs(g:params()) do
      if t.name:match("lora_up") then p:set(t.name, T.random_values(r, t.numel, -0.2, 0.2)) end
    end
    return p
  end
  local pd, p0 = build(0.5), build(0)
  local l0, ltrain = p0:forward(), pd:forward()
  pd.training = false
  local leval = pd:forward()
  T.ok(leval == l0 and ltrain ~= l0, string.format("dropout 0.5: a training pass gives %.6f, an evaluation pass %.6f, "
    .. "the loss without dropout (%.6f)", ltrain, leval, l0))
  pd.training = true
  pd:step()
  local name = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_v.lora_down.weight"
  local gr = pd:grad(name)
  local worst = fd_worst(pd, name, gr, {1, 9, #gr})
  T.ok(worst <= 1, string.format("with dropout, lora_down's gradients match central differences of the training "
    .. "pass (worst %.2f of the tolerance)", worst))
end

T.done()
