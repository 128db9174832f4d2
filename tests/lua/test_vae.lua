-- The SDXL VAE in ck.vae against diffusers' AutoencoderKL: the tiny random-weight
-- model's encoder mean/logvar and decoder image equal diffusers' (within 1e-4
-- relative), the full SDXL VAE's parameters are exactly diffusers' keys and
-- shapes, and its graphs build at 1024x1024. Reference files: tests/ref/make_vae_ref.py.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local vae = require "ck.vae"

local DATA = "tests/data/vae/"

-- "name [d0,d1,...]" per line -> {name = "d0,d1,..."}, count
local function read_keys(path)
  local keys, n = {}, 0
  for line in io.lines(path) do
    local name, shape = line:match("^(%S+)%s+%[([%d,]*)%]%s*$")
    if name then
      keys[name] = shape
      n = n + 1
    end
  end
  return keys, n
end

-- the graph's parameters against a key list: nil when they are the same set
-- with the same shapes, else the first differences
local function diff_keys(params, want, nwant)
  local have, nhave = {}, 0
  for _, p in ipairs(params) do
    have[p.name] = table.concat(p.shape, ",")
    nhave = nhave + 1
  end
  local diffs = {}
  local function note(s) diffs[#diffs + 1] = s end
  for name, shape in pairs(want) do
    if not have[name] then note("missing " .. name)
    elseif have[name] ~= shape then note(name .. " is [" .. have[name] .. "], want [" .. shape .. "]") end
  end
  for name in pairs(have) do
    if not want[name] then note("unexpected " .. name) end
  end
  if nwant ~= nhave then note(string.format("%d parameters, want %d", nhave, nwant)) end
  table.sort(diffs)
  while #diffs > 5 do table.remove(diffs) end
  return #diffs > 0 and table.concat(diffs, "; ") or nil
end

-- max |a - b| / max |b|
local function rel_err(a, b)
  if #a ~= #b then return math.huge end
  local e, m = 0, 0
  for i = 1, #b do
    e = math.max(e, math.abs(a[i] - b[i]))
    m = math.max(m, math.abs(b[i]))
  end
  return m > 0 and e / m or e
end

local function shape_str(s) return "[" .. table.concat(s, ",") .. "]" end

local function clock(t0) return string.format("%.2fs", os.clock() - t0) end

local io_file = ck.safetensors(DATA .. "tiny_io.safetensors")
local weights = ck.safetensors(DATA .. "tiny.safetensors")

do -- config: the named ones and a diffusers config.json table
  local c = vae.config("sdxl")
  T.ok(table.concat(c.block_out_channels, ",") == "128,256,512,512" and c.layers_per_block == 2 and
       c.latent_channels == 4 and c.norm_num_groups == 32 and c.scaling_factor == 0.13025,
       "vae.config('sdxl') has SDXL's widths, layers, latent channels, groups and scaling factor")
  c.block_out_channels[1] = 1
  T.ok(vae.config("sdxl").block_out_channels[1] == 128, "vae.config returns a fresh copy")
  local j = ck.json_decode('{"_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": [128, 256, 512,' ..
    ' 512], "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D",' ..
    ' "DownEncoderBlock2D"], "in_channels": 3, "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": 32,' ..
    ' "out_channels": 3, "sample_size": 1024, "scaling_factor": 0.13025, "shift_factor": null, "up_block_types":' ..
    ' ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "force_upcast": true}')
  local jc = vae.config(j)
  T.ok(jc.shift_factor == nil and jc.scaling_factor == 0.13025 and jc.use_quant_conv == true,
       "a config.json table reads (null shift_factor as none, defaults for missing keys)")
  local g = ck.graph()
  vae.build_encoder(g, j, {height = 64, width = 64})
  local g2 = ck.graph()
  vae.build_encoder(g2, "sdxl", {height = 64, width = 64})
  T.ok(g:param_count() == g2:param_count(), "the config.json table builds the same encoder as 'sdxl'")
  local ok, err = pcall(vae.config, {block_out_channels = {64}, down_block_types = {"CrossAttnDownBlock2D"}})
  T.ok(not ok and err:find("only DownEncoderBlock2D is supported", 1, true),
       "an unsupported block type is refused by name (" .. tostring(err) .. ")")
  ok, err = pcall(function() vae.config("huge") end)
  T.ok(not ok and err:find("test_vae.lua:%d+: unknown VAE config 'huge'"),
       "an unknown config name is an error naming the script line (" .. tostring(err) .. ")")
end

do -- the tiny encoder: mean and logvar equal diffusers' for a 64x48 image
  local t0 = os.clock()
  local g = ck.graph()
  local m, mean, logvar = vae.build_encoder(g, "tiny", {batch = 1, height = 64, width = 48})
  T.ok(shape_str(mean.shape) == "[1,4,8,6]" and shape_str(logvar.shape) == "[1,4,8,6]",
       "tiny encoder: mean and logvar are [1,4,8,6] for a 1x3x64x48 image (got " .. shape_str(mean.shape) .. ")")
  local all, train = g:param_count()
  T.ok(train == 0, "the encoder's parameters are frozen by default (" .. train .. " trainable of " .. all .. ")")
  T.ok(m:get("encoder.down_blocks.0.downsamplers.0") ~= nil and m:get("quant_conv") ~= nil,
       "the encoder's module tree names diffusers' paths")
  local p = g:compile{outputs = {mean, logvar}, optimizer = "none"}
  p:load(weights, vae.weights(g))
  p:set("sample", io_file:read("sample"))
  p:forward()
  local em = rel_err(p:get(mean), io_file:read("mean"))
  local el = rel_err(p:get(logvar), io_file:read("logvar"))
  T.ok(em < 1e-4, string.format("tiny encoder mean equals diffusers' (max rel err %.3g)", em))
  T.ok(el < 1e-4, string.format("tiny encoder logvar equals diffusers' (max rel err %.3g)", el))
  print("     encoder compile, load, forward took " .. clock(t0) .. " CPU")
end

do -- the tiny decoder: the image equals diffusers' for a [1,4,8,6] latent
  local t0 = os.clock()
  local g = ck.graph()
  local _, image = vae.build_decoder(g, "tiny", {batch = 1, height = 8, width = 6})
  T.ok(shape_str(image.shape) == "[1,3,64,48]",
       "tiny decoder: a [1,4,8,6] latent gives a [1,3,64,48] image (got " .. shape_str(image.shape) .. ")")
  local _, train = g:param_count()
  T.ok(train == 0, "the decoder's parameters are frozen by default")
  local p = g:compile{outputs = {image}, optimizer = "none"}
  p:load(weights, vae.weights(g))
  p:set("latents", io_file:read("latents"))
  p:forward()
  local e = rel_err(p:get(image), io_file:read("image"))
  T.ok(e < 1e-4, string.format("tiny decoder image equals diffusers' (max rel err %.3g)", e))
  print("     decoder compile, load, forward took " .. clock(t0) .. " CPU")
end

do -- unscale = true: the decoder takes latents as the cache stores them (times scaling_factor)
  local g = ck.graph()
  local _, image = vae.build_decoder(g, "tiny", {height = 8, width = 6, unscale = true})
  local p = g:compile{outputs = {image}, optimizer = "none"}
  p:load(weights, vae.weights(g))
  local z = io_file:read("latents")
  for i = 1, #z do z[i] = z[i] * 0.13025 end
  p:set("latents", z)
  p:forward()
  local e = rel_err(p:get(image), io_file:read("image"))
  T.ok(e < 1e-4, string.format("decoding scaled latents with unscale = true equals diffusers' (max rel err %.3g)", e))
end

do -- both halves in one graph, loaded from one file by the same map
  local g = ck.graph()
  local _, mean = vae.build_encoder(g, "tiny", {height = 64, width = 48})
  local _, image = vae.build_decoder(g, "tiny", {height = 8, width = 6})
  local want, nwant = {}, 0
  for _, k in ipairs(weights:keys()) do
    want[k] = table.concat(weights:shape(k), ",")
    nwant = nwant + 1
  end
  local d = diff_keys(g:params(), want, nwant)
  T.ok(d == nil, "tiny encoder + decoder parameters are exactly the keys and shapes of diffusers' state_dict" ..
       (d and (": " .. d) or ""))
  local p = g:compile{outputs = {mean, image}, optimizer = "none"}
  p:load(weights, vae.weights(g))
  p:set("sample", io_file:read("sample"))
  p:set("latents", io_file:read("latents"))
  p:forward()
  local e = math.max(rel_err(p:get(mean), io_file:read("mean")), rel_err(p:get(image), io_file:read("image")))
  T.ok(e < 1e-4, string.format("encoder and decoder in one program both equal diffusers' (max rel err %.3g)", e))
end

do -- the cache recipe: (mean + exp(0.5 logvar) noise) * scaling_factor
  local cached = vae.latents(io_file:read("mean"), io_file:read("logvar"), io_file:read("noise"), "tiny")
  local e = rel_err(cached, io_file:read("cached"))
  T.ok(e < 1e-5, string.format("vae.latents equals diffusers' latent_dist.sample() * scaling_factor (rel err %.3g)", e))
  local lv = vae.latents({1, 1}, {100, -100}, {1, 1}, {block_out_channels = {32}, norm_num_groups = 32,
                                                        scaling_factor = 1})
  T.ok(math.abs(lv[1] - (1 + math.exp(10))) < 1e-9 and math.abs(lv[2] - (1 + math.exp(-15))) < 1e-12,
       "vae.latents clamps logvar to [-30, 20] as diffusers does")
  local mode = vae.latents({2, -4}, {0, 0}, nil, "sdxl")
  T.ok(mode[1] == 2 * 0.13025 and mode[2] == -4 * 0.13025, "vae.latents without noise gives mean * scaling_factor")
  local ok, err = pcall(vae.latents, {1, 2}, {1}, {1, 2})
  T.ok(not ok and err:find("mean has 2 values, logvar 1", 1, true), "mismatched lengths are an error")
end

do -- the full SDXL VAE: diffusers' keys and shapes; graphs at 1024x1024 build (never compiled)
  local t0 = os.clock()
  local want, nwant = read_keys(DATA .. "sdxl_vae_keys.txt")
  local g = ck.graph()
  local _, mean, logvar = vae.build_encoder(g, "sdxl", {batch = 1, height = 1024, width = 1024})
  local _, image = vae.build_decoder(g, "sdxl", {batch = 1, height = 128, width = 128})
  local d = diff_keys(g:params(), want, nwant)
  T.ok(d == nil, "sdxl VAE parameter names and shapes equal " .. DATA .. "sdxl_vae_keys.txt" .. (d and (": " .. d) or ""))
  local all = g:param_count()
  T.ok(all == 83653863, "the sdxl VAE has 83653863 parameters (got " .. all .. ")")
  T.ok(shape_str(mean.shape) == "[1,4,128,128]" and shape_str(logvar.shape) == "[1,4,128,128]" and
       shape_str(image.shape) == "[1,3,1024,1024]",
       "sdxl VAE graphs at 1024x1024: latents [1,4,128,128], image [1,3,1024,1024] (built in " .. clock(t0) .. ")")
end

do -- options: trainable on request; configs without quant convs or mid-block attention
  local g = ck.graph()
  vae.build_decoder(g, "tiny", {height = 8, width = 6, frozen = false})
  local all, train = g:param_count()
  T.ok(train == all and all > 0, "frozen = false leaves every decoder parameter trainable")
  local c = vae.config("tiny")
  c.use_quant_conv, c.use_post_quant_conv, c.mid_block_add_attention = false, false, false
  local g2 = ck.graph()
  vae.build_encoder(g2, c, {height = 64, width = 48})
  vae.build_decoder(g2, c, {height = 8, width = 6})
  local found = {}
  for _, t in ipairs(g2:params()) do
    if t.name:find("quant_conv", 1, true) then found[#found + 1] = t.name end
    if t.name:find("attentions", 1, true) then found[#found + 1] = t.name end
  end
  T.ok(#found == 0, "use_quant_conv, use_post_quant_conv and mid_block_add_attention = false drop those modules (" ..
       table.concat(found, ", ") .. ")")
end

do -- bad input: one clear error naming the script line
  local g = ck.graph()
  local ok, err = pcall(function() vae.build_encoder(g, "tiny", {height = 0, width = 48}) end)
  T.ok(not ok and err:find("test_vae.lua:%d+: vae.build_encoder: height must be a positive whole number"),
       "a zero height is refused at the script line (" .. tostring(err) .. ")")
  local g2 = ck.graph()
  vae.build_decoder(g2, "tiny", {height = 8, width = 6})
  local p = g2:compile{outputs = {}, optimizer = "none"}
  ok, err = pcall(function() p:load(ck.safetensors(DATA .. "tiny_io.safetensors"), vae.weights(g2)) end)
  T.ok(not ok and err:find("tiny_io.safetensors: missing tensor '", 1, true),
       "loading from a file without the VAE's keys names the file and the key (" .. tostring(err) .. ")")
end

T.done()
