-- FLUX.1's VAE in ck.vae against diffusers' AutoencoderKL (tests/ref/make_flux_ref.py):
-- 16 latent channels, no quant convs, latents cached as (z - 0.1159) * 0.3611 and
-- decoded from z / 0.3611 + 0.1159; the full config's keys are diffusers'.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local vae = require "ck.vae"

local DATA = "tests/data/flux/"

local function rel_err(a, b)
  local e, m = 0, 0
  for i = 1, #b do e, m = math.max(e, math.abs(a[i] - b[i])), math.max(m, math.abs(b[i])) end
  return #a == #b and e / m or math.huge
end

do -- the config: diffusers' FLUX.1 vae/config.json, named
  local c = vae.config("flux")
  T.ok(c.latent_channels == 16 and c.scaling_factor == 0.3611 and c.shift_factor == 0.1159 and
       c.use_quant_conv == false and c.use_post_quant_conv == false and table.concat(c.block_out_channels, ",") ==
       "128,256,512,512" and c.layers_per_block == 2 and c.norm_num_groups == 32,
       "vae.config('flux'): 16 latent channels, shift 0.1159, scale 0.3611, no quant convs, SDXL's widths")
  local j = ck.json_decode(io.open(DATA .. "vae/config.json"):read("a"))
  local jc, tiny = vae.config(j), vae.config("flux-tiny")
  local same = true
  for _, k in ipairs{"latent_channels", "scaling_factor", "shift_factor", "use_quant_conv", "use_post_quant_conv",
                     "layers_per_block", "norm_num_groups", "sample_size"} do
    same = same and jc[k] == tiny[k]
  end
  T.ok(same and table.concat(jc.block_out_channels, ",") == table.concat(tiny.block_out_channels, ","),
    "the reference folder's config.json reads as vae.config('flux-tiny')")
end

do -- the full FLUX.1 VAE: diffusers' keys and shapes (graphs recorded at 64 px, never compiled)
  local g = ck.graph()
  vae.build_encoder(g, "flux", {height = 64, width = 64})
  vae.build_decoder(g, "flux", {height = 8, width = 8})
  local want, n = {}, 0
  for line in io.lines(DATA .. "flux_vae_keys.txt") do
    local k, s = line:match("^(%S+) %[([%d,]*)%]$")
    want[k], n = s, n + 1
  end
  local bad, have = nil, 0
  for _, t in ipairs(g:params()) do
    have = have + 1
    if want[t.name] ~= table.concat(t.shape, ",") then bad = bad or t.name end
  end
  T.ok(not bad and have == n and n == 244,
    "the FLUX.1 VAE's 244 tensors are diffusers' names and shapes (no quant_conv, 32-channel moments)" ..
    (bad and (": not " .. bad) or ""))
end

local io_file <close> = ck.safetensors(DATA .. "vae/io.safetensors")
local weights <close> = ck.safetensors(DATA .. "vae/diffusion_pytorch_model.safetensors")

do -- encode, then the cache's latents: (mean + exp(0.5 logvar) noise - shift) * scale
  local g = ck.graph()
  local m, mean, logvar = vae.build_encoder(g, "flux-tiny", {height = 16, width = 24})
  T.ok(table.concat(mean.shape, ",") == "1,16,8,12" and m:get("quant_conv") == nil,
    "the encoder gives 16 latent channels straight from conv_out (no quant_conv)")
  local p = g:compile{outputs = {mean, logvar}, optimizer = "none"}
  p:load(weights, vae.weights(g))
  p:set("sample", io_file:read("sample"))
  p:forward()
  local em, el = rel_err(p:get(mean), io_file:read("mean")), rel_err(p:get(logvar), io_file:read("logvar"))
  T.ok(em < 1e-4 and el < 1e-4, string.format("mean and logvar are diffusers' (max rel err %.3g, %.3g)", em, el))
  local cached = vae.latents(io_file:read("mean"), io_file:read("logvar"), io_file:read("noise"), "flux-tiny")
  local e = rel_err(cached, io_file:read("cached"))
  T.ok(e < 1e-6, string.format("vae.latents shifts then scales, as FLUX.1's training scripts (rel err %.3g)", e))
end

do -- decode the cached latents: z / scale + shift into the decoder
  local g = ck.graph()
  local m, image = vae.build_decoder(g, "flux-tiny", {height = 8, width = 12})
  T.ok(m:get("post_quant_conv") == nil and table.concat(image.shape, ",") == "1,3,16,24",
    "the decoder takes 16 channels straight into conv_in (no post_quant_conv)")
  local p = g:compile{outputs = {image}, optimizer = "none"}
  p:load(weights, vae.weights(g))
  p:set("latents", vae.unscale(io_file:read("cached"), "flux-tiny"))
  p:forward()
  local e = rel_err(p:get(image), io_file:read("image"))
  T.ok(e < 1e-4, string.format("decoding vae.unscale(cached) is diffusers' decode(z / scale + shift) (max rel err %.3g)", e))
  local u = vae.unscale({0.3611, 0}, "flux")
  T.ok(math.abs(u[1] - 1.1159) < 1e-12 and u[2] == 0.1159, "vae.unscale: z / 0.3611 + 0.1159")
  local ok, err = pcall(function() local _, im = vae.build_decoder(ck.graph(), "flux", {unscale = true}); return im end)
  T.ok(not ok and tostring(err):find("test_flux_vae.lua:%d+:.*vae.unscale"),
    "unscale = true with a shift is refused, pointing to vae.unscale: " .. tostring(err))
end

T.done()
