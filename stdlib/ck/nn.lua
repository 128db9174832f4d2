-- Modules in the torch7/nn manner over the ck op graph: a module is built first
-- (a tree of named children), then forward(g, ...) records its ops inside
-- g:scope(name) so parameter names are full diffusers keys.
local ck = require "ck"

local nn = {}

local Module = {}
Module.__index = Module
Module.__name = "nn.Module"
nn.Module = Module

-- nn.class("Linear", nn.Module) -> a class table; calling it constructs an instance.
-- A deep copy of a table of plain values (a model's config); other values as they are.
function nn.copy(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = nn.copy(v) end
  return c
end

function nn.class(name, parent)
  parent = parent or Module
  local cls = setmetatable({}, {
    __index = parent,
    __call = function(c, ...)
      local self = setmetatable({children = {}}, c)
      self:init(...)
      return self
    end,
  })
  cls.__index = cls
  cls.__name = "nn." .. name
  cls.super = parent
  return cls
end

function Module:init() end

-- Registers child under a name relative to self ("resnets.0", "to_out.0");
-- children keep their registration order, as torch's state_dict does.
function Module:add(name, child)
  assert(type(name) == "string" and name ~= "", "a child needs a name")
  assert(getmetatable(child) and child.forward, "child '" .. name .. "' is not a module")
  child.name = name
  self.children[#self.children + 1] = child
  return child
end

local function join(prefix, name)
  if prefix == nil or prefix == "" then return name end
  return prefix .. "." .. name
end

-- Every module below self (self included) as {path, module}, pre-order,
-- children in registration order. prefix: the path of self ("" at the root).
function Module:named_modules(prefix)
  local out = {}
  local function walk(m, path)
    out[#out + 1] = {path, m}
    for _, c in ipairs(m.children) do walk(c, join(path, c.name)) end
  end
  walk(self, prefix or "")
  return out
end

-- The module at a dotted path relative to self, or nil.
function Module:get(path)
  for _, e in ipairs(self:named_modules("")) do
    if e[1] == path then return e[2] end
  end
  return nil
end

function Module:type() return getmetatable(self).__name end

-- Base parameters of self and everything below become frozen ({trainable=false})
-- when the graph is recorded; flag false undoes it.
function Module:freeze(flag)
  if flag == nil then flag = true end
  for _, e in ipairs(self:named_modules()) do e[2].frozen = flag end
  return self
end

-- Declares a parameter named relative to the current scope.
function Module:param(g, name, shape, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  if self.frozen then o.trainable = false end
  return g:param(name, shape, o)
end

-- Records self's ops inside its scope; the root (no name) records unscoped.
function Module:forward(g, ...)
  if self.name == nil or self.name == "" then return self:updateOutput(g, ...) end
  return g:scope(self.name, self.updateOutput, self, g, ...)
end

function Module:updateOutput()
  error(self:type() .. " has no updateOutput", 2)
end

-- PyTorch's default bias init for Linear and Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
local function bias_init(fan_in)
  local b = 1 / math.sqrt(fan_in)
  return {init = "uniform", a = -b, b = b}
end

---- Linear{in, out, bias=true}: y = x W^T + b over the last dim

local Linear = nn.class("Linear")
nn.Linear = Linear

function Linear:init(o)
  self.in_features = assert(o[1] or o.in_features, "Linear: in features")
  self.out_features = assert(o[2] or o.out_features, "Linear: out features")
  self.bias = o.bias ~= false and o[3] ~= false
end

-- act = "geglu": geglu of the product as one op (GEGLU, nn.fuse_linear_geglu)
function Linear:updateOutput(g, x, act)
  local w = self:param(g, "weight", {self.out_features, self.in_features})
  local b = self.bias and self:param(g, "bias", {self.out_features}, bias_init(self.in_features)) or nil
  if act == "geglu" then return ck.linear_geglu(x, w, b) end
  return ck.linear(x, w, b)
end

---- Conv2d{in, out, kernel, stride=1, padding=0, bias=true}, NCHW

local Conv2d = nn.class("Conv2d")
nn.Conv2d = Conv2d

function Conv2d:init(o)
  self.in_channels = assert(o[1] or o.in_channels, "Conv2d: in channels")
  self.out_channels = assert(o[2] or o.out_channels, "Conv2d: out channels")
  self.kernel = o[3] or o.kernel or 1
  self.stride = o.stride or o[4] or 1
  self.padding = o.padding or o[5] or 0
  self.bias = o.bias ~= false and o[6] ~= false
end

function Conv2d:updateOutput(g, x)
  local k = self.kernel
  local w = self:param(g, "weight", {self.out_channels, self.in_channels, k, k})
  local b = self.bias and self:param(g, "bias", {self.out_channels}, bias_init(self.in_channels * k * k)) or nil
  return ck.conv2d(x, w, b, {stride = self.stride, padding = self.padding})
end

---- GroupNorm{groups, channels, eps=1e-5}

local GroupNorm = nn.class("GroupNorm")
nn.GroupNorm = GroupNorm

function GroupNorm:init(o)
  self.groups = assert(o[1] or o.groups, "GroupNorm: groups")
  self.channels = assert(o[2] or o.channels, "GroupNorm: channels")
  self.eps = o.eps or o[3] or 1e-5
end

-- act = "silu": silu of the norm as one op (nn.norm_act)
function GroupNorm:updateOutput(g, x, act)
  local w = self:param(g, "weight", {self.channels}, {init = "ones"})
  local b = self:param(g, "bias", {self.channels}, {init = "zeros"})
  if act == "silu" then return ck.group_norm_silu(x, self.groups, w, b, self.eps) end
  return ck.group_norm(x, self.groups, w, b, self.eps)
end

-- Whether nn.norm_act fuses a GroupNorm and SiLU: true keeps the norm's output
-- out of the plan (one op, recorded in the norm's scope, whose backward
-- recomputes it); false builds the two ops, for comparing the two graphs.
nn.fuse_norm_silu = true

-- act(norm(x)) for a GroupNorm whose output nothing else reads. act: nil
-- (SiLU), an op constructor (ck.silu, ck.mish) or a module (a SiLU module
-- names the activation's scope when the two are built apart).
function nn.norm_act(g, norm, x, act)
  local silu = act == nil or act == ck.silu or getmetatable(act) == nn.SiLU
  if silu and nn.fuse_norm_silu then return norm:forward(g, x, "silu") end
  local h = norm:forward(g, x)
  if act == nil then return ck.silu(h) end
  if type(act) == "function" then return act(h) end
  return act:forward(g, h)
end

---- LayerNorm{dim, eps=1e-5, elementwise_affine=true, bias=true} over the last dim
-- (torch.nn.LayerNorm's options: elementwise_affine=false has no parameters,
-- as Flux's norms; bias=false a weight alone)

local LayerNorm = nn.class("LayerNorm")
nn.LayerNorm = LayerNorm

function LayerNorm:init(o)
  self.dim = assert(o[1] or o.dim, "LayerNorm: dim")
  self.eps = o.eps or o[2] or 1e-5
  self.affine = o.elementwise_affine ~= false
  self.bias = self.affine and o.bias ~= false
end

function LayerNorm:updateOutput(g, x)
  if not self.affine then return ck.layer_norm(x, nil, nil, self.eps) end
  local w = self:param(g, "weight", {self.dim}, {init = "ones"})
  local b = self.bias and self:param(g, "bias", {self.dim}, {init = "zeros"}) or nil
  return ck.layer_norm(x, w, b, self.eps)
end

---- RMSNorm{dim, eps=1e-6, elementwise_affine=true} over the last dim:
-- x / sqrt(mean(x^2) + eps) * weight (torch.nn.RMSNorm; T5's LayerNorm and
-- Flux's q/k norms, whose statistic is fp32 whatever the storage)

local RMSNorm = nn.class("RMSNorm")
nn.RMSNorm = RMSNorm

function RMSNorm:init(o)
  self.dim = assert(o[1] or o.dim, "RMSNorm: dim")
  self.eps = o.eps or o[2] or 1e-6
  self.affine = o.elementwise_affine ~= false
end

function RMSNorm:updateOutput(g, x)
  local w = self.affine and self:param(g, "weight", {self.dim}, {init = "ones"}) or nil
  return ck.rms_norm(x, w, self.eps)
end

-- The table ck.rope reads: for L tokens with positions ids[l] = {p_1, .., p_n}
-- on n axes of axes_dim[i] dims each (even, summing to the head dim D), a flat
-- list of L * D numbers, row l holding (cos, sin) of each pair's angle: axis
-- i's pair j turns by p_i / theta^(2j / axes_dim[i]). Black Forest Labs'
-- EmbedND (and diffusers' FluxPosEmbed) in their float64, axes in order; the
-- graph keeps the table, a g:input, in fp32. Flux: axes_dim {16, 56, 56},
-- theta 10000, ids {0, 0, 0} for text tokens and {0, row, col} for image ones.
function nn.rope_table(ids, axes_dim, theta)
  theta = theta or 10000
  if type(ids) ~= "table" or type(axes_dim) ~= "table" then error("rope_table(ids, axes_dim [, theta])", 2) end
  if type(theta) ~= "number" or not (theta > 0) then error("rope_table: theta must be a positive number", 2) end
  local omega = {}
  for i, d in ipairs(axes_dim) do
    if math.type(d) ~= "integer" or d <= 0 or d % 2 ~= 0 then
      error("rope_table: axes_dim[" .. i .. "] must be a positive even whole number, got " .. tostring(d), 2)
    end
    for j = 0, d // 2 - 1 do omega[#omega + 1] = {i, 1 / theta ^ (2 * j / d)} end
  end
  local out, n = {}, 0
  for l, pos in ipairs(ids) do
    if type(pos) ~= "table" or #pos ~= #axes_dim then
      error("rope_table: ids[" .. l .. "] must list " .. #axes_dim .. " positions, one per axis", 2)
    end
    for _, w in ipairs(omega) do
      local p = pos[w[1]]
      if type(p) ~= "number" then error("rope_table: ids[" .. l .. "] holds a " .. type(p) .. ", not a position", 2) end
      local a = p * w[2]
      out[n + 1], out[n + 2] = math.cos(a), math.sin(a)
      n = n + 2
    end
  end
  return out
end

---- SiLU (no parameters; a module so that trees can name it, as conv_act)

local SiLU = nn.class("SiLU")
nn.SiLU = SiLU

function SiLU:updateOutput(_, x) return ck.silu(x) end

---- Mish: x * tanh(softplus(x)), torch.nn.Mish (diffusers' act_fn = "mish")

local Mish = nn.class("Mish")
nn.Mish = Mish

function Mish:updateOutput(_, x) return ck.mish(x) end

-- diffusers' get_activation for the activations ck has as one op
local activations = {silu = ck.silu, swish = ck.silu, mish = ck.mish}

---- Attention{query_dim, cross_attention_dim=nil (self), heads, dim_head} on [B, L, C]

local Attention = nn.class("Attention")
nn.Attention = Attention

function Attention:init(o)
  local q = assert(o.query_dim or o[1], "Attention: query_dim")
  local ctx = o.cross_attention_dim or q
  self.heads = assert(o.heads, "Attention: heads")
  self.dim_head = assert(o.dim_head, "Attention: dim_head")
  self.is_cross = o.cross_attention_dim ~= nil
  local inner = self.heads * self.dim_head
  self.to_q = self:add("to_q", Linear{q, inner, bias = false})
  self.to_k = self:add("to_k", Linear{ctx, inner, bias = false})
  self.to_v = self:add("to_v", Linear{ctx, inner, bias = false})
  self.to_out = self:add("to_out.0", Linear{inner, q})
end

-- x [B, L, query_dim]; context [B, S, cross_attention_dim] or nil for self-attention
function Attention:updateOutput(g, x, context)
  context = context or x
  local q = self.to_q:forward(g, x)
  local k = self.to_k:forward(g, context)
  local v = self.to_v:forward(g, context)
  local out = self.to_out:forward(g, ck.attention(q, k, v, self.heads))
  if (self.dropout or 0) > 0 then out = ck.dropout(out, self.dropout) end -- to_out.1
  return out
end

---- GEGLU{dim_in, dim_out}: proj to 2*dim_out, then first half * gelu(second half)

local GEGLU = nn.class("GEGLU")
nn.GEGLU = GEGLU

function GEGLU:init(o)
  self.proj = self:add("proj", Linear{o[1] or o.dim_in, 2 * (o[2] or o.dim_out)})
end

-- Whether GEGLU builds its product and the GEGLU as one op (LINEAR_GEGLU, in
-- proj's scope, with proj's parameter names): true where proj is a plain Linear
-- (an adapter adds its branch between the two, so an adapted proj builds the
-- pair); false builds the pair, for comparing the two graphs.
nn.fuse_linear_geglu = true

function GEGLU:updateOutput(g, x)
  local proj = self.proj
  if nn.fuse_linear_geglu and getmetatable(proj) == Linear and rawget(proj, "updateOutput") == nil then
    return proj:forward(g, x, "geglu")
  end
  return ck.geglu(proj:forward(g, x))
end

---- FeedForward{dim, mult=4}: net.0 (GEGLU), net.1 (dropout when self.dropout > 0), net.2 (Linear)

local FeedForward = nn.class("FeedForward")
nn.FeedForward = FeedForward

function FeedForward:init(o)
  local dim = assert(o[1] or o.dim, "FeedForward: dim")
  local inner = dim * (o.mult or 4)
  self.act = self:add("net.0", GEGLU{dim, inner})
  self.out = self:add("net.2", Linear{inner, o.dim_out or dim})
end

function FeedForward:updateOutput(g, x)
  local h = self.act:forward(g, x)
  if (self.dropout or 0) > 0 then h = ck.dropout(h, self.dropout) end -- net.1
  return self.out:forward(g, h)
end

---- Timesteps{num_channels, flip_sin_to_cos, downscale_freq_shift}: t [N] -> [N, num_channels]

local Timesteps = nn.class("Timesteps")
nn.Timesteps = Timesteps

function Timesteps:init(o)
  self.num_channels = assert(o[1] or o.num_channels, "Timesteps: num_channels")
  self.flip_sin_to_cos = o.flip_sin_to_cos or o[2] or false
  self.shift = o.downscale_freq_shift or o[3] or 0
end

function Timesteps:updateOutput(_, t)
  return ck.timestep_embedding(t, self.num_channels, {flip_sin_to_cos = self.flip_sin_to_cos, shift = self.shift})
end

---- TimestepEmbedding{in, time_embed_dim, act_fn="silu"}: linear_1, act_fn (silu or mish), linear_2

local TimestepEmbedding = nn.class("TimestepEmbedding")
nn.TimestepEmbedding = TimestepEmbedding

function TimestepEmbedding:init(o)
  local i = assert(o[1] or o.in_channels, "TimestepEmbedding: in")
  local d = assert(o[2] or o.time_embed_dim, "TimestepEmbedding: time_embed_dim")
  self.linear_1 = self:add("linear_1", Linear{i, d})
  self.linear_2 = self:add("linear_2", Linear{d, o.out_dim or d})
  self.act = activations[o.act_fn or "silu"]
  if not self.act then
    error("TimestepEmbedding: act_fn '" .. tostring(o.act_fn) .. "' is not one of silu, swish, mish", 3)
  end
end

function TimestepEmbedding:updateOutput(g, x)
  return self.linear_2:forward(g, self.act(self.linear_1:forward(g, x)))
end

return nn
