-- Script options (ck.sdxl.options): a script declares the names it takes;
-- an unknown or misspelt option, or a bare word, is refused at the line that
-- declared them, naming the closest name; reading an undeclared name is an
-- error at the reading line; each typed read checks its value.
package.path = "tests/lua/?.lua;" .. package.path
local sdxl = require "ck.sdxl"
local T = require "check"

local KNOWN = {"steps", "max-grad-norm", "lr", "storage", "resume", "targets"}

local function refused(args, want)
  local line
  local ok, err = pcall(function() line = debug.getinfo(1, "l").currentline; local o = sdxl.options(args, KNOWN); return o end)
  T.ok(not ok and err:find("test_options.lua:" .. line .. ":", 1, true) and err:find(want, 1, true),
    "refused at the declaring line with '" .. want .. "': " .. tostring(err))
end

do -- what is given is read back; script (ckrun's own field) is not an option
  local o = sdxl.options({steps = 7, lr = 1e-4, resume = true, script = "x.lua"}, KNOWN)
  T.ok(o:count("steps", 300) == 7 and o:get("lr", 3e-3) == 1e-4 and o:flag("resume", false) == true
    and o:get("max-grad-norm", 1.0) == 1.0, "given values read back, defaults for the rest")
  T.ok(#o:list("targets", "to_q, to_k ,to_v") == 3 and o:list("targets", "to_q, to_k ,to_v")[2] == "to_k",
    "a list is split on commas and trimmed")
end

refused({["max-grad-nrom"] = 0.5}, "unknown option --max-grad-nrom (did you mean --max-grad-norm?)")
refused({storag = "bf16"}, "unknown option --storag (did you mean --storage?)")
refused({colour = "red"}, "unknown option --colour; the options are --steps, --max-grad-norm")
refused({"extra"}, "unexpected argument 'extra' (options are --name value)")

do
  local ok, err = pcall(sdxl.options, {})
  T.ok(not ok and err:match("give the list"), "the list of names is required: " .. tostring(err))
end

do -- reading a name the script did not declare, and bad values, name the reading line
  local o = sdxl.options({steps = 0, storage = "fp8"}, KNOWN)
  local function at(f, want)
    local line = debug.getinfo(2, "l").currentline
    local ok, err = pcall(f)
    T.ok(not ok and err:find("test_options.lua:" .. line .. ":", 1, true) and err:find(want, 1, true),
      "'" .. want .. "' at the reading line: " .. tostring(err))
  end
  at(function() local v = o:get("seed", 1) return v end, "option --seed is read but not in the script's list of options")
  at(function() local v = o:count("steps", 300) return v end, "--steps must be an integer >= 1, got '0'")
  at(function() local v = o:choice("storage", "fp32", {"fp32", "bf16"}) return v end, "--storage must be fp32 or bf16, got 'fp8'")
end

T.done()
