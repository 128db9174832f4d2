-- ck.fit at one batch compiles the training step once and lets the C
-- decision choose on that graph: none where none fits, else the budget
-- search at the room the limit leaves; the kept trial is the program a fresh
-- compile under the chosen policy plans, to the byte; a refusal builds none
-- once more to say what it needs; the choice, compiled at another shape (a
-- bucket's), decides under the same room. (sdxl-tiny at 256 px, plan only.)
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local policy = require "ck.policy"
local fit = require "ck.fit"

local builds, policies = 0, {}
local function build(batch, pol)
  builds = builds + 1
  policies[#policies + 1] = pol.kind
  return sdxl.training_step{config = unet.config("sdxl-tiny"), batch = batch, latent = {32, 32},
                            lora = {rank = 4, alpha = 4}, compile = {checkpoint = pol, plan_only = true}}
end
local function reset() builds, policies = 0, {} end

local none = build(1, policy.none()).program:plan()
reset()

-- room for none: one build, none chosen
local c = fit.choose{build = build, checkpoint = policy.auto{device = 2 * none.device_bytes}, batch = 1, keep = true}
T.ok(builds == 1 and policies[1] == "auto", "room for none: one build, under auto (" .. builds .. ")")
T.ok(policy.name(c.checkpoint) == "none" and c.reason:match("none fits"), "room for none: none (" .. c.reason .. ")")
T.ok(c.run and c.run.program:plan().device_bytes == none.device_bytes, "the kept run is none's plan")

-- less room: one build, a budget whose whole run fits, and the kept program
-- is what a fresh compile at the chosen budget plans
reset()
local size = math.floor(none.device_bytes * 0.9)
c = fit.choose{build = build, checkpoint = policy.auto{device = size}, batch = 1, keep = true}
local limit = math.floor(size * (1 - fit.HEADROOM))
local kept = c.run.program:plan()
T.ok(builds == 1, "a budget needed: one build (" .. builds .. ")")
T.ok(policy.name(c.checkpoint):match("^budget:%d+$") and kept.recompute_flops > 0 and kept.device_bytes <= limit,
     string.format("a budget that recomputes, its whole run within %d bytes (%d)", limit, kept.device_bytes))
T.ok(kept.none_peak == none.peak, "the decision placed none and says its peak (" .. tostring(kept.none_peak) .. ")")
T.ok(c.reason:match("none needs"), "the reason names what none needs (" .. c.reason .. ")")
local fresh = build(1, c.checkpoint).program:plan()
T.ok(fresh.layout_digest == kept.layout_digest and fresh.peak == kept.peak and
     fresh.recompute_flops == kept.recompute_flops, "the kept program plans as a fresh compile at the chosen budget")

-- the choice holds for the run's other shapes (a bucket's latents): where
-- none fits the square's room, a larger bucket compiled under the choice
-- still fits it (under none itself it would not)
reset()
local wide = function(pol)
  return sdxl.training_step{config = unet.config("sdxl-tiny"), batch = 1, latent = {32, 40},
                            lora = {rank = 4, alpha = 4}, compile = {checkpoint = pol, plan_only = true}}.program:plan()
end
local room = math.floor(none.device_bytes * 1.05 / (1 - fit.HEADROOM))
c = fit.choose{build = build, checkpoint = policy.auto{device = room}, batch = 1}
local under_none, under_choice = wide(policy.none()), wide(c.checkpoint)
T.ok(policy.name(c.checkpoint) == "none" and under_none.device_bytes > room * (1 - fit.HEADROOM) and
     under_choice.device_bytes <= room * (1 - fit.HEADROOM) and under_choice.recompute_flops > 0,
     string.format("a wider bucket under the choice ('none' at the square) fits the room: %d of %d (none: %d)",
                   under_choice.device_bytes, math.floor(room * (1 - fit.HEADROOM)), under_none.device_bytes))

-- without keep, nothing is held
reset()
c = fit.choose{build = build, checkpoint = policy.auto{device = size}, batch = 1}
T.ok(c.run == nil and builds == 1, "without keep: no run kept, one build")

-- nothing fits: the auto build, then none's to say what none needs
reset()
local ok, err = pcall(fit.choose, {build = build, checkpoint = policy.auto{device = math.floor(none.device_bytes * 0.2)},
                                   batch = 1})
T.ok(not ok and tostring(err):match("nothing fits") and tostring(err):match("none needs"), "refused: " .. tostring(err))
T.ok(builds == 2 and policies[2] == "none", "refused after the auto build and none's (" .. builds .. " builds)")

-- the decision's figures reach the caller through the policy's report table:
-- none's placed peak on success, the smallest peak when nothing fits (the
-- figure the message states)
local report = {}
local pol = policy.budget(math.floor(none.peak * 0.9))
pol.report = report
build(1, pol)
T.ok(report.floor == nil, "a budget that fits reports no floor")
report = {}
pol = policy.auto{device = math.floor(none.peak * 0.9), headroom = 0}
pol.report = report
build(1, pol)
T.ok(report.none_peak == none.peak, "auto reports none's placed peak (" .. tostring(report.none_peak) .. ")")
report = {}
pol = policy.budget(math.floor(none.peak * 0.1))
pol.report = report
ok, err = pcall(build, 1, pol)
local stated = tonumber(tostring(err):match("smallest peak ckrun can plan is [%d.]+ MiB %((%d+) bytes%)"))
T.ok(not ok and report.floor and report.floor == stated,
     string.format("nothing fits: the report's floor is the smallest peak the message states (%s, %s)",
                   tostring(report.floor), tostring(stated)))

T.done()
