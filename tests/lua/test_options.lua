-- Script options (ck.options): a script declares each option once (name, type,
-- default, description); an unknown or misspelt option, or a bare word, is
-- refused at the line that declared them, naming the closest name; a ckrun
-- option given after the script is told to go before it; every value, given
-- or default, goes through its type and check; reading an undeclared name is
-- an error at the reading line; --help lists each option and runs nothing.
package.path = "tests/lua/?.lua;" .. package.path
local options = require "ck.options"
local T = require "check"

local SPEC = {
  about = "a test script",
  {"steps", "integer", 300, "batches to train", min = 1},
  {"max-grad-norm", "number", 1.0, "clip the gradients' global norm", min = 0},
  {"lr", "number", 3e-3, "the learning rate"},
  {"storage", "choice", "fp32", "how activations are stored", choices = {"fp32", "bf16"}},
  {"resume", "flag-or-string", false, "continue from DIR", arg = "[DIR]"},
  {"targets", "list", "to_q, to_k ,to_v", "the adapted modules"},
  {"size", "choice", "tiny", "the model", choices = {"tiny", "full"}},
  {"batch", "integer", function(v) return v.size == "full" and 1 or 2 end, "samples per step", min = 1,
   shown = "1 with --size full, else 2"},
  {"resolution", "integer", 256, "pixels", check = function(v) return v % 64 == 0 end,
   says = "must be a multiple of 64 pixels"},
}

-- f raises, at the line of the test that called it, an error containing want
local function fails_here(f, want)
  local line = debug.getinfo(2, "l").currentline
  local ok, err = pcall(f)
  T.ok(not ok and err:find("test_options.lua:" .. line .. ":", 1, true) and err:find(want, 1, true),
    "'" .. want .. "' at line " .. line .. ": " .. tostring(err))
end

local function refused(args, want, spec)
  fails_here(function() local o = options.parse(args, spec or SPEC) return o end, want)
end

do -- what is given is read back; defaults for the rest; script (ckrun's own field) is not an option
  local o = options.parse({steps = 7, lr = 1e-4, resume = true, script = "x.lua"}, SPEC)
  T.ok(o.steps == 7 and o.lr == 1e-4 and o.resume == true and o["max-grad-norm"] == 1.0
    and math.type(o["max-grad-norm"]) == "float" and o.storage == "fp32", "given values read back, defaults for the rest")
  T.ok(#o.targets == 3 and o.targets[2] == "to_k", "a list is split on commas and trimmed")
  T.ok(o:given("steps") and o:given("lr") and not o:given("storage"), "given() tells a given value from a default")
  T.ok(o.batch == 2 and options.parse({size = "full"}, SPEC).batch == 1, "a computed default reads the options above it")
  T.ok(options.parse({resume = "out/s"}, SPEC).resume == "out/s", "--resume DIR gives the folder")
end

refused({["max-grad-nrom"] = 0.5}, "unknown option --max-grad-nrom (did you mean --max-grad-norm?)")
refused({storag = "bf16"}, "unknown option --storag (did you mean --storage?)")
refused({colour = "red"}, "unknown option --colour; the options are --steps, --max-grad-norm")
refused({"extra"}, "unexpected argument 'extra' (options are --name value)")
refused({plan = true}, "unknown option --plan (a ckrun option: put ckrun's options before the script)")
refused({["max-batch"] = "24GiB"}, "unknown option --max-batch (a ckrun option: put ckrun's options before the script)")
do -- a ckrun option the script takes itself is the script's
  local o = options.parse({svg = "x.svg"}, {{"svg", "string", "out/a.svg", "the chart"}})
  T.ok(o.svg == "x.svg", "an option named like ckrun's that the script declares is the script's")
end

-- bad values, given or computed, at the line that parsed them, in the texts scripts always used
refused({steps = 0}, "--steps must be an integer >= 1, got '0'")
refused({storage = "fp8"}, "--storage must be fp32 or bf16, got 'fp8'")
refused({resolution = 100}, "--resolution must be a multiple of 64 pixels, got 100")
refused({resolution = "big"}, "--resolution must be a multiple of 64 pixels, got big")
refused({lr = "fast"}, "--lr must be a number, got 'fast'")
refused({}, "the default of --batch must be an integer >= 1, got '0'",
  {{"batch", "integer", function() return 0 end, "samples", min = 1, shown = "none"}})

do -- also = {"auto"}: those words taken as they are, numbers checked by the type
  local spec = {{"batch", "integer", 2, "samples per step", min = 1, also = {"auto"}}}
  T.ok(options.parse({batch = "auto"}, spec).batch == "auto" and options.parse({batch = 3}, spec).batch == 3
    and options.parse({}, spec).batch == 2, "--batch auto is taken as it is, --batch 3 as a number")
  refused({batch = 0}, "--batch must be an integer >= 1 or auto, got '0'", spec)
  refused({batch = "most"}, "--batch must be an integer >= 1 or auto, got 'most'", spec)
  T.ok(options.help(spec, "x.lua"):find("--batch N|auto", 1, true), "help shows --batch N|auto")
end

do -- a computed default reads any option, declared above or below it; one reading itself or an undeclared name is refused
  local spec = {{"batch", "integer", function(v) return v.size == "full" and 1 or 2 end, "samples", shown = "2"},
                {"size", "choice", "tiny", "the model", choices = {"tiny", "full"}}}
  T.ok(options.parse({size = "full"}, spec).batch == 1 and options.parse({}, spec).batch == 2,
    "a default reads an option declared below it")
  refused({}, "options.parse: a default reads --colour, which is not declared",
    {{"batch", "integer", function(v) return v.colour and 1 or 2 end, "samples", shown = "2"}})
  refused({}, "options.parse: the default of --a reads itself (through the defaults it reads)",
    {{"a", "integer", function(v) return v.b end, "a", shown = "b"},
     {"b", "integer", function(v) return v.a end, "b", shown = "a"}})
  T.ok(options.parse({b = 4}, {{"a", "integer", function(v) return v.b end, "a", shown = "b"},
    {"b", "integer", function(v) return v.a end, "b", shown = "a"}}).a == 4, "a given value ends the chain")
end

-- a default that would not parse fails every run, given a value or not
refused({}, "the default of --budgets does not parse: --budgets wants a comma-separated list, got 'true'",
  {{"budgets", "list", true, "budgets"}})
refused({steps = 3}, "the default of --steps does not parse: --steps must be an integer >= 1, got '0'",
  {{"steps", "integer", 0, "batches", min = 1}})

-- the declaration itself
refused({}, "options.parse: give the script's table of options", 5)
refused({}, "--x has no description", {{"x", "string", "a"}})
refused({}, "--x: unknown type 'text'", {{"x", "text", "a", "x"}})
refused({}, "--x: a computed default needs shown", {{"x", "string", function() return "a" end, "x"}})
refused({}, "--x is declared twice", {{"x", "string", "a", "x"}, {"x", "string", "a", "x"}})

do -- positional arguments
  local spec = {{"dir", "string", nil, "the folder", pos = 1, arg = "DIR", required = true},
                {"n", "integer", nil, "how many", pos = 2, arg = "N", min = 1, required = true}}
  local o = options.parse({"out/d", 4}, spec)
  T.ok(o.dir == "out/d" and o.n == 4, "positional arguments by position")
  refused({"out/d"}, "N is required", spec)
  refused({"out/d", 0}, "--n must be an integer >= 1, got '0'", spec)
  refused({"out/d", 2, "more"}, "unexpected argument 'more'", spec)
end

do -- reading a name the script did not declare names the reading line
  local o = options.parse({}, SPEC)
  fails_here(function() local v = o.seed return v end, "option --seed is read but not in the script's list of options")
  fails_here(function() local g = o:given("seed") return g end, "option --seed is not in the script's list of options")
end

do -- --help: every option with its description and default; parse returns nil so the script stops
  local text = options.help(SPEC, "scripts/x.lua")
  T.ok(text:find("usage: ckrun [ckrun options] scripts/x.lua", 1, true) and text:find("a test script", 1, true),
    "help starts with the usage and the script's line")
  local all = true
  for _, e in ipairs(SPEC) do
    local line = text:match("\n  %-%-" .. e[1]:gsub("%-", "%%-") .. "[ \n][^\n]*")
    local d = e.shown or tostring(e[3])
    if not (line and line:find(e[4], 1, true) and line:find("(default: " .. d .. ")", 1, true)) then
      all = false
      print("  help line for --" .. e[1] .. ": " .. tostring(line))
    end
  end
  T.ok(all, "help has a line per option with its description and default")
  T.ok(text:find("--storage fp32|bf16", 1, true) and text:find("--steps N", 1, true)
    and text:find("--resume [DIR]", 1, true), "help shows each option's value: choices, N, [DIR]")
  T.ok(options.parse({help = true, steps = "bad"}, SPEC) == nil, "--help makes parse return nil before any check")
end

do -- headings group the options in --help and are no options
  local spec = {{heading = "the model"}, {"size", "choice", "tiny", "the model", choices = {"tiny", "full"}},
                {heading = "the run"}, {"steps", "integer", 3, "batches"}}
  local text = options.help(spec, "x.lua")
  T.ok(text:find("\n the model:\n  --size tiny|full", 1, true) and text:find("\n the run:\n  --steps N", 1, true),
    "help shows each heading before its options")
  local o = options.parse({steps = 4}, spec)
  T.ok(o.steps == 4 and o.size == "tiny", "parse reads past the headings")
  refused({}, "options.parse: entry 1: a heading is a string", {{heading = 3}})
end

do -- an option given twice: refused, unless it repeats (then a list of every value, in order)
  local function with_repeats(t, reps) return setmetatable(t, {repeated = reps}) end
  local ok, err = pcall(options.parse, with_repeats({steps = 5}, {steps = {3, 5}}), SPEC)
  T.ok(not ok and err:find("--steps is given 2 times ('3', '5'): give it once", 1, true),
    "a repeated option that does not repeat is refused, with its values (" .. tostring(err) .. ")")
  local spec = {{"lora", "string", nil, "files", repeats = true}, {"n", "integer", 1, "a count", repeats = true, min = 1}}
  local o = options.parse(with_repeats({lora = "c"}, {lora = {"a", "b", "c"}}), spec)
  T.ok(#o.lora == 3 and o.lora[1] == "a" and o.lora[3] == "c", "a repeating option lists its values in order")
  o = options.parse({lora = "a"}, spec)
  T.ok(#o.lora == 1 and o.lora[1] == "a" and o.n[1] == 1, "given once, or by default, it is a list of one")
  T.ok(options.parse({}, {{"lora", "string", nil, "files", repeats = true}}).lora == nil, "no default: nil")
  local bad_ok, bad = pcall(options.parse, with_repeats({n = 0}, {n = {2, 0}}), spec)
  T.ok(not bad_ok and tostring(bad):find("--n", 1, true), "each repeated value goes through the type's checks")
end

-- kohya's spellings (spec.kohya): underscores for dashes, kohya's names of
-- ckrun options, and one line saying what ckrun has where kohya's option means
-- something else
local KSPEC = {kohya = true}
for i, e in ipairs(SPEC) do KSPEC[i] = e end
for _, e in ipairs{{"rank", "integer", 4, "the adapters' rank", min = 1},
                   {"alpha", "number", function(v) return v.rank end, "alpha", shown = "the rank"},
                   {"optimizer", "choice", "adamw", "the optimizer", choices = {"adamw", "adamw8bit", "lion"}},
                   {"checkpoint", "string", "none", "the checkpoint policy"},
                   {"prediction", "choice", "eps", "what the model predicts", choices = {"eps", "v"}},
                   {"out", "string", "out/lora.safetensors", "the file written"}} do
  KSPEC[#KSPEC + 1] = e
end
do
  local o = options.parse({learning_rate = 1e-4, network_dim = 8, network_alpha = 2, max_grad_norm = 0.5,
                           train_batch_size = 3}, KSPEC)
  T.ok(o.lr == 1e-4 and o.rank == 8 and o.alpha == 2 and o["max-grad-norm"] == 0.5 and o.batch == 3 and
    o:given("lr") and o:given("rank"), "kohya's --learning_rate, --network_dim, --network_alpha, --train_batch_size " ..
    "and --max_grad_norm are --lr, --rank, --alpha, --batch and --max-grad-norm")
  o = options.parse({gradient_checkpointing = true, v_parameterization = true, optimizer_type = "AdamW8bit"}, KSPEC)
  T.ok(o.checkpoint == "diffusers" and o.prediction == "v" and o.optimizer == "adamw8bit",
    "--gradient_checkpointing is --checkpoint diffusers, --v_parameterization --prediction v, --optimizer_type " ..
    "AdamW8bit --optimizer adamw8bit")
  T.ok(options.parse({["learning-rate"] = 0.5}, KSPEC).lr == 0.5, "kohya's names spelt with dashes too")
  T.ok(options.parse({["max_grad_norm"] = 0.25}, SPEC)["max-grad-norm"] == 0.25,
    "any declared option spelt with underscores, kohya or not")
end
refused({["lerning-rate"] = 1e-4}, "unknown option --lerning-rate (did you mean --lr?)", KSPEC)
refused({lerning_rate = 1e-4}, "unknown option --lerning_rate (did you mean --lr?)", KSPEC)
refused({network_dm = 8}, "unknown option --network_dm (did you mean --rank?)", KSPEC)
do -- a hint for every unknown option: no list of the options after it
  local ok, err = pcall(options.parse, {["lerning-rate"] = 1}, KSPEC)
  T.ok(not ok and not err:find("the options are", 1, true), "a near name and no list (" .. tostring(err) .. ")")
end
refused({learning_rate = 1e-4}, "unknown option --learning_rate; the options are", SPEC)
refused({lr = 1, learning_rate = 2}, "--learning_rate and --lr are given, which name one option (--lr): give one", KSPEC)
refused({optimizer_type = "Prodigy"}, "--optimizer_type (--optimizer) must be adamw or adamw8bit or lion, got 'prodigy'",
  KSPEC)
refused({v_parameterization = "sometimes"}, "--v_parameterization is a flag (kohya's; ckrun's --prediction v)", KSPEC)
refused({max_train_steps = 100}, "--max_train_steps is kohya's option: it counts updates; ckrun's --steps counts " ..
  "batches (updates times --gradient-accumulation-steps)", KSPEC)
refused({output_dir = "x"}, "--output_dir is kohya's option: ckrun writes one file: --out " ..
  "OUTPUT_DIR/OUTPUT_NAME.safetensors", KSPEC)
do -- a far name in a table of many options: where to find them, not all of them
  local many = {}
  for i = 1, 20 do many[i] = {"option-" .. i, "integer", i, "option " .. i} end
  local ok, err = pcall(options.parse, {script = "x.lua", colour = "red"}, many)
  T.ok(not ok and err:find("unknown option --colour; `ckrun x.lua --help` lists its 20 options", 1, true) and
    not err:find("--option-1,", 1, true), "an unknown option far from 20 others points to --help (" .. tostring(err) .. ")")
end

T.done()
