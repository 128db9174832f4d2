-- From images and captions to the samples training reads: the SDXL VAE's
-- encoder and both text encoders as ck programs, run once per image into a
-- cache of sample files (latents, prompt_embeds, pooled_prompt_embeds,
-- time_ids: the format ck.data.latents reads), keyed so that a changed image,
-- caption or setting re-encodes only that image.
--
--   local encode = require "ck.encode"
--   local models = encode.models{base = desc_or_nil, size = "tiny", seed = 1}
--   local files = encode.cache(plan, models, {cache_dir = "out/cache", seed = 1, flip_aug = false})
--
-- One VAE program per bucket shape, all sharing one copy of the VAE's weights
-- (compile{share}); one text program for both encoders. The programs exist
-- while encoding and are closed after it, before the training programs are
-- made, so the run's peak is the larger of the two phases, not their sum.
local ck = require "ck"
local vae = require "ck.vae"
local clip = require "ck.clip"
local imagedata = require "ck.imagedata"
local sdxl = require "ck.sdxl"

local M = {}

local KEY_VAE_NOISE = 0x7AE0

-- Whether dir is a folder of images (kohya's layout: images, or N_concept
-- folders of them) rather than of encoded samples: it holds no .safetensors
-- file, and an image or a folder.
function M.is_image_folder(dir)
  local names = ck.listdir(dir)
  if not names then return false end
  local any = false
  for _, name in ipairs(names) do
    if name:match("%.safetensors$") then return false end
    local ext = name:match("%.([^.]+)$")
    if (ext and imagedata.IMAGE_EXTENSIONS[ext:lower()]) or ck.listdir(dir .. "/" .. name) then any = true end
  end
  return any
end


-- ck.clip_tokenizer's options for a path: a folder, a tokenizer.json, or a
-- bpe .txt.gz file
local function tokenizer_at(path, pad, fix)
  if ck.listdir(path) then return {dir = path, pad = pad, caption_fix = fix} end
  if path:match("%.json$") then return {json = path, pad = pad, caption_fix = fix} end
  return {bpe = path, pad = pad, caption_fix = fix}
end

M.CAPTION_FIXES = {ftfy = true, none = true}

-- The encoders for a base model (checkpoint.open's description) or, without
-- one, the tiny random ones of --size tiny (seeded). o.tokenizer: a folder,
-- a tokenizer.json or a bpe file for both tokenizers (the pad of the second
-- is "!", as SDXL's tokenizer_2), in place of the base's tokenizer folders.
-- o.caption_fix: "ftfy" (the default: ftfy's fix_text first, as
-- transformers' CLIPTokenizer runs it where ftfy is installed, as in kohya's
-- installs) or "none". Returns {vae_config, text_l, text_g (clip configs),
-- tokenizer_l, tokenizer_g, base, seed, id (what the cache keys name: the
-- model's identity, the tokenizer given and the caption fix)}.
function M.models(o)
  local m = {base = o.base, seed = o.seed or 1, chunks = (o.max_token_length or 75) // 75}
  local d = o.base
  local fix = o.caption_fix or "ftfy"
  if not M.CAPTION_FIXES[fix] then
    error(string.format("--caption-fix must be ftfy or none, got '%s'", tostring(fix)), 0)
  end
  local tl, tg
  local given = o.tokenizer
  if given then
    tl, tg = tokenizer_at(given, nil, fix), tokenizer_at(given, "!", fix)
  else
    if d and d.tokenizer then tl = {dir = d.tokenizer, caption_fix = fix} end
    if d and d.tokenizer_2 then tg = {dir = d.tokenizer_2, caption_fix = fix} end
    if not tl or not tg then
      if d then
        error("the base model has no tokenizer folders: give --tokenizer FILE|DIR (open_clip's " ..
          "bpe_simple_vocab_16e6.txt.gz, a tokenizer folder or a tokenizer.json)", 0)
      end
      -- the tiny random encoders' vocabulary, built into ckrun
      tl, tg = {tiny = true, caption_fix = fix}, {tiny = true, pad = "!", caption_fix = fix}
    end
  end
  m.tokenizer_l, m.tokenizer_g = ck.clip_tokenizer(tl), ck.clip_tokenizer(tg)
  if d then
    m.vae_config = vae.config(d.vae_config or "sdxl")
    m.text_l = clip.config(d.text_encoder_config or "sdxl-l")
    m.text_g = clip.config(d.text_encoder_2_config or "sdxl-g")
    m.id = "base " .. tostring(d.file)
  else
    m.vae_config = vae.config("tiny")
    m.text_l, m.text_g = clip.config("tiny-l"), clip.config("tiny-g")
    m.id = "tiny random seed " .. m.seed
  end
  -- the encoders' context: SDXL's 77 positions (a small test model may have fewer)
  m.frame = math.min(m.text_l.max_position_embeddings, m.text_g.max_position_embeddings)
  if m.chunks > 1 and m.frame ~= sdxl.TOKENS then
    error(string.format("--max-token-length needs text encoders of %d positions; these have %d", sdxl.TOKENS, m.frame), 0)
  end
  m.tokens = m.chunks == 1 and m.frame or 75 * m.chunks + 2
  if m.chunks > 1 then m.id = m.id .. " max_token_length " .. 75 * m.chunks end
  -- captions encoded before ftfy's fixes (and with other tokenizers) keyed otherwise
  if given then m.id = m.id .. " tokenizer " .. given end
  if fix ~= "none" then m.id = m.id .. " caption_fix " .. fix end
  return m
end

-- The VAE's encoder at one bucket (pixels w x h), batch 1; share: a program
-- of the group whose weights it uses. Returns {program, mean, logvar}.
function M.vae_program(models, w, h, share)
  local g = ck.graph()
  local _, mean, logvar = vae.build_encoder(g, models.vae_config, {batch = 1, height = h, width = w})
  local p = g:compile{outputs = {mean, logvar}, optimizer = "none", seed = models.seed, share = share}
  if not share and models.base then
    require("ck.checkpoint").load(p, "vae", models.base.vae, g:params())
  end
  return {program = p, mean = mean, logvar = logvar}
end

-- a part of the base model with its map's names under prefix (the text
-- encoders' parameters are "text_encoder." .. transformers' key)
local function prefixed(part, prefix)
  local m = {}
  for k, v in pairs(part.map) do m[prefix .. k] = v end
  return {file = part.file, map = m}
end

-- Both text encoders for b captions (b times the chunks of each with
-- --max-token-length); share: a text program whose weights it uses.
-- Returns {program, te (clip.sdxl's), b}.
function M.text_program(models, b, share)
  local g = ck.graph()
  local te = clip.sdxl(g, models.text_l, models.text_g, {batch = b * models.chunks, tokens = models.frame})
  local p = g:compile{outputs = {te.prompt_embeds, te.pooled}, optimizer = "none", seed = models.seed, share = share}
  if models.base and not share then
    local l, gg = {}, {}
    for _, prm in ipairs(g:params()) do
      if prm.name:match("^text_encoder_2%.") then gg[#gg + 1] = prm else l[#l + 1] = prm end
    end
    local checkpoint = require "ck.checkpoint"
    checkpoint.load(p, "text_encoder", prefixed(models.base.text_encoder, "text_encoder."), l)
    checkpoint.load(p, "text_encoder_2", prefixed(models.base.text_encoder_2, "text_encoder_2."), gg)
  end
  return {program = p, te = te, b = b}
end

-- The tokens of each caption for both encoders: ids_l, ids_g (lists of rows
-- of 77; with chunks, each caption's chunks in turn)
function M.tokens(models, captions)
  local l, g = {}, {}
  for _, c in ipairs(captions) do
    if models.chunks == 1 then
      l[#l + 1] = models.tokenizer_l:encode(c, {max_length = models.frame})
      g[#g + 1] = models.tokenizer_g:encode(c, {max_length = models.frame})
    else
      for _, row in ipairs(models.tokenizer_l:encode_chunks(c, 75 * models.chunks)) do l[#l + 1] = row end
      for _, row in ipairs(models.tokenizer_g:encode_chunks(c, 75 * models.chunks)) do g[#g + 1] = row end
    end
  end
  return l, g
end

-- prompt_embeds [B, T, D] and pooled [B, P] of the captions, as flat lists.
-- With k chunks a caption's hidden states are joined as kohya's sd-scripts
-- joins them: the first chunk's BOS, the 75 states after BOS of each chunk,
-- the last chunk's final state (T = 75 k + 2); pooled is the first chunk's.
function M.encode_text(tp, models, captions)
  local ids_l, ids_g = M.tokens(models, captions)
  tp.te:feed(tp.program, ids_l, ids_g)
  tp.program:forward()
  local pe, pooled = tp.program:get(tp.te.prompt_embeds), tp.program:get(tp.te.pooled)
  local k = models.chunks
  if k == 1 then return pe, pooled end
  local D, P = #pe // (#ids_l * sdxl.TOKENS), #pooled // #ids_l
  local out, pout = {}, {}
  local function row(c, t) -- caption chunk c (0-based overall), token t (0-based): append its D values
    local at = (c * 77 + t) * D
    for j = 1, D do out[#out + 1] = pe[at + j] end
  end
  for b = 0, #captions - 1 do
    row(b * k, 0)
    for c = 0, k - 1 do
      for t = 1, 75 do row(b * k + c, t) end
    end
    row(b * k + k - 1, 76)
    for j = 1, P do pout[#pout + 1] = pooled[b * k * P + j] end
  end
  return out, pout
end

-- The latents of one image (an array [3, H, W] in [-1, 1]) through a VAE
-- program: sampled from the encoder's distribution with noise keyed by
-- (seed, epoch, noise_key) and scaled by scaling_factor, as a flat list.
function M.latents_of(vp, models, image, noise_key, seed, epoch)
  local p = vp.program
  p:set("sample", image)
  p:forward()
  local mean, logvar = p:get(vp.mean), p:get(vp.logvar)
  local noise = {}
  for i = 1, #mean do noise[i] = ck.randn(seed, epoch or 0, noise_key, i) end
  return vae.latents(mean, logvar, noise, models.vae_config)
end

-- Whether path holds a whole cached sample of plan entry e: a safetensors
-- file whose header and sizes check out, with the latents of e's bucket and
-- the other tensors this run reads. A file cut short or written by something
-- else is encoded again (written whole and renamed into place, as always).
function M.cached(path, e, models, flip_aug, with_text)
  local ok, f = pcall(ck.safetensors, path)
  if not ok then return false end
  local good = f:has("latents") and f:has("time_ids")
  if good then
    local s = f:shape("latents")
    good = #s == 3 and s[1] == models.vae_config.latent_channels and s[2] == e.bucket[2] // 8 and
      s[3] == e.bucket[1] // 8
  end
  if good and flip_aug then good = f:has("latents_flipped") and f:has("time_ids_flipped") end
  if good and with_text then
    good = f:has("prompt_embeds") and f:has("pooled_prompt_embeds") and f:shape("prompt_embeds")[1] == models.tokens
  end
  f:close()
  return good
end

-- Encodes every image of plan (imagedata.assign's) not yet in the cache.
-- o: cache_dir (the scanned folder: each image's file beside it, in its
-- N_concept folder; or another folder, which gets the same layout), seed, flip_aug (each file holds
-- the flipped latents and time ids too), random_crop (refused: a cached crop
-- is fixed), progress (print a line per image and the rate), text = false
-- (latents only: captions are encoded at each step). Returns the sample file
-- of each plan item, in order, and the bound on the process's memory while
-- encoding (ck.memory.outside's; nil without a heap cap).
function M.cache(plan, models, o)
  o = o or {}
  if o.random_crop then
    error("--random-crop draws a new crop at every use, so its latents cannot be cached; leave it out", 0)
  end
  local seed, with_text = o.seed or 1, o.text ~= false
  if type(o.cache_dir) ~= "string" then error("encode.cache: give cache_dir", 2) end
  local out, todo = {}, {}
  for i, e in ipairs(plan.items) do
    local id = models.id .. (o.flip_aug and " flip_aug" or "") .. (with_text and (" caption " .. e.caption) or "")
    local key = imagedata.cache_key(e, {model_id = id})
    local path = imagedata.cache_path(e, o.cache_dir, key)
    out[i] = path
    if not M.cached(path, e, models, o.flip_aug, with_text) then todo[#todo + 1] = i end
  end
  if #todo == 0 then
    if o.progress then print(string.format("cache: all %d images encoded already", #plan.items)) end
    return out
  end
  local t0 = ck.now()
  local vps, first = {}, nil
  local tp = with_text and M.text_program(models, 1) or nil
  for n, i in ipairs(todo) do
    local e = plan.items[i]
    local bw, bh = e.bucket[1], e.bucket[2]
    local bk = bw .. "x" .. bh
    if not vps[bk] then
      vps[bk] = M.vae_program(models, bw, bh, first and first.program or nil)
      first = first or vps[bk]
    end
    local vp = vps[bk]
    local tensors = {}
    local c = e.crop
    local img = ck.image_load(e.path, {resize = e.resized, crop = c})
    local lat = M.latents_of(vp, models, img, KEY_VAE_NOISE + 2 * i, seed)
    local lh, lw = bh // 8, bw // 8
    tensors[#tensors + 1] = {"latents", {models.vae_config.latent_channels, lh, lw}, lat}
    tensors[#tensors + 1] = {"time_ids", {6}, e.time_ids}
    if o.flip_aug then
      local flipped = ck.image_load(e.path, {resize = e.resized, crop = c, flip = true})
      tensors[#tensors + 1] = {"latents_flipped", {models.vae_config.latent_channels, lh, lw},
                               M.latents_of(vp, models, flipped, KEY_VAE_NOISE + 2 * i + 1, seed)}
      tensors[#tensors + 1] = {"time_ids_flipped", {6}, e.time_ids_flip}
    end
    if tp then
      local pe, pooled = M.encode_text(tp, models, {e.caption})
      tensors[#tensors + 1] = {"prompt_embeds", {models.tokens, #pe // models.tokens}, pe}
      tensors[#tensors + 1] = {"pooled_prompt_embeds", {#pooled}, pooled}
    end
    local d = out[i]:match("^(.*)/[^/]*$")
    if d then assert(ck.mkdir(d)) end
    ck.write_safetensors(out[i], tensors, {source = "ckrun image cache", image = e.path, caption = e.caption})
    if o.progress and (n == 1 or n == #todo or n % 10 == 0) then
      local dt = ck.now() - t0
      print(string.format("cache: encoded %d/%d images (%.2f images/s) %s", n, #todo, n / math.max(dt, 1e-9), e.path))
    end
  end
  if o.progress then
    print(string.format("cache: %d image%s encoded in %.1f s, %d already there", #todo, #todo == 1 and "" or "s",
      ck.now() - t0, #plan.items - #todo))
  end
  -- the bound this phase states for the whole process (nil without a heap
  -- cap), then every encoder closed before training makes its programs
  local programs = {first.program}
  for _, vp in pairs(vps) do if vp ~= first then programs[#programs + 1] = vp.program end end
  if tp then programs[#programs + 1] = tp.program end
  local _, bound = require("ck.memory").outside(first.program, programs)
  for _, q in ipairs(programs) do local closing <close> = q end
  return out, bound
end

return M
