/* libFuzzer harness for the checkpoint key mapping (stdlib/ck/checkpoint.lua):
 * each input is a list of tensor names, one a line (an optional " d,d,..."
 * after a name gives its shape, else [1]); the harness writes them as a
 * single-file SDXL checkpoint (with the tensors that identify the sdxl-tiny
 * UNet unless the input names them) and opens it with checkpoint.open. An
 * input starting with "folder\n" is written instead as the unet weights of a
 * diffusers folder. Either the open is refused with a message naming the
 * file, or every key of the file under a part's prefix is a source of that
 * part's map and every name of a map is a parameter of the part's
 * architecture (checkpoint.parameter_names): no key silently skipped, none
 * mapped to a name the model lacks. The VM, opened once, must stay healthy. */
#include "fuzz_util.h"

#include <ck.h>

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#define H "fuzz_checkpoint"

static ck_vm *vm;
static const char *const dirs[2] = {fuzz_dir, NULL};

static const char *setup =
    "local ck = require 'ck'\n"
    "local checkpoint = require 'ck.checkpoint'\n"
    "local unet = require 'ck.unet'\n"
    "local config = unet.config('sdxl-tiny')\n"
    "local boc1 = config.block_out_channels[1]\n"
    "local ident = {\n"
    "  ['model.diffusion_model.input_blocks.0.0.weight'] = {boc1, config.in_channels, 3, 3},\n"
    "  ['model.diffusion_model.label_emb.0.0.weight'] = {boc1 * 4, config.projection_class_embeddings_input_dim},\n"
    "}\n"
    "local PREFIX = {unet = 'model.diffusion_model.', vae = 'first_stage_model.',\n"
    "  text_encoder = 'conditioner.embedders.0.transformer.', text_encoder_2 = 'conditioner.embedders.1.model.'}\n"
    "local SKIPPED = {['conditioner.embedders.1.model.logit_scale'] = true,\n"
    "  ['conditioner.embedders.0.transformer.text_model.embeddings.position_ids'] = true}\n"
    "local sets = {}\n"
    "local function names_of(part, c)\n"
    "  local key = part .. (part == 'unet' and ' tiny' or '')\n"
    "  sets[key] = sets[key] or checkpoint.parameter_names(part, c)\n"
    "  return sets[key]\n"
    "end\n"
    "local function entries_of(text, folder)\n"
    "  local entries, seen = {}, {}\n"
    "  for line in text:gmatch('[^\\n]+') do\n"
    "    local name, dims = line:match('^(.-) ([%d,]+)$')\n"
    "    name = name or line\n"
    "    local shape = {}\n"
    "    for d in (dims or ''):gmatch('%d+') do\n"
    "      local n = math.tointeger(tonumber(d))\n"
    "      if n and n >= 1 and n <= 64 and #shape < 4 then shape[#shape + 1] = n end\n"
    "    end\n"
    "    if #shape == 0 then shape = {1} end\n"
    "    if not seen[name] then\n"
    "      seen[name] = true\n"
    "      local n = 1\n"
    "      for _, d in ipairs(shape) do n = n * d end\n"
    "      local v = {}\n"
    "      for i = 1, n do v[i] = 0 end\n"
    "      entries[#entries + 1] = {name, shape, v}\n"
    "    end\n"
    "  end\n"
    "  if not folder then\n"
    "    for k, shape in pairs(ident) do\n"
    "      if not seen[k] then\n"
    "        local n = 1\n"
    "        for _, d in ipairs(shape) do n = n * d end\n"
    "        local v = {}\n"
    "        for i = 1, n do v[i] = 0 end\n"
    "        entries[#entries + 1] = {k, shape, v}\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  return entries\n"
    "end\n"
    "local function check(d, path, keys, folder)\n"
    "  local sources = {}\n"
    "  for part, pre in pairs(PREFIX) do\n"
    "    local p = d[part]\n"
    "    if p then\n"
    "      local names = names_of(part, part == 'unet' and config or\n"
    "        ({vae = 'sdxl', text_encoder = 'sdxl-l', text_encoder_2 = 'sdxl-g'})[part])\n"
    "      for name, src in pairs(p.map) do\n"
    "        if not names[name] then return 'invariant: ' .. part .. ' maps ' .. name .. ', no parameter' end\n"
    "        sources[type(src) == 'table' and src.key or src] = true\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  for _, k in ipairs(keys) do\n"
    "    local under = folder\n"
    "    for _, pre in pairs(PREFIX) do under = under or k:sub(1, #pre) == pre end\n"
    "    if under and not sources[k] and not SKIPPED[k] then return 'invariant: key ' .. k .. ' skipped' end\n"
    "  end\n"
    "  return nil\n"
    "end\n"
    "function open_one(text)\n"
    "  local folder = text:sub(1, 7) == 'folder\\n'\n"
    "  if folder then text = text:sub(8) end\n"
    "  local entries = entries_of(text, folder)\n"
    "  local path = folder and 'f/unet/diffusion_pytorch_model.safetensors' or 'c.safetensors'\n"
    "  if folder then\n"
    "    assert(ck.mkdir('f/unet'))\n"
    "    local f = assert(io.open('f/unet/config.json', 'wb'))\n"
    "    f:write(ck.json_encode(config))\n"
    "    f:close()\n"
    "  end\n"
    "  if not pcall(ck.write_safetensors, path, entries) then return true, 'not writable' end\n"
    "  local keys = {}\n"
    "  for _, e in ipairs(entries) do keys[#keys + 1] = e[1] end\n"
    "  local ok, d = pcall(checkpoint.open, folder and 'f' or path, {unet_config = not folder and config or nil})\n"
    "  if not ok then\n"
    "    local msg = tostring(d)\n"
    "    if msg:find('\\n') then return false, 'invariant: a refusal of two lines: ' .. msg end\n"
    "    if not msg:find(folder and 'f/' or path, 1, true) then return false, 'invariant: a refusal not naming the file: ' .. msg end\n"
    "    return true, msg\n"
    "  end\n"
    "  local bad = check(d, path, keys, folder)\n"
    "  if bad then return false, bad end\n"
    "  return true, 'opened'\n"
    "end\n";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_scratch("checkpoint");
    fuzz_enter();
    ck_options o = {0};
    o.heap_limit = 256u << 20;
    o.callback_budget = 10000000;
    o.no_default_dirs = 1;
    o.allow_read = dirs;
    o.allow_write = dirs;
    vm = ck_open(&o);
    if (!vm || ck_run_string(vm, setup, "fuzz_checkpoint") != CK_OK) {
        fprintf(stderr, H ": setup failed: %s\n", vm ? ck_error(vm) : "no VM");
        abort();
    }
    fuzz_leave(0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_enter();
    ck_value arg = {.type = CK_TSTRING, .string = size ? (const char *)data : "", .len = size}, res[2];
    int st = ck_call(vm, "open_one", 1, &arg, 2, res);
    if (st != CK_OK) fprintf(stderr, H ": %s\n", ck_error(vm));
    fuzz_check(st == CK_OK, H, "open_one runs to its end");
    fuzz_check(res[0].type == CK_TBOOLEAN && res[1].type == CK_TSTRING, H, "open_one returns ok, message");
    if (!res[0].number) fprintf(stderr, H ": %.*s\n", (int)res[1].len, res[1].string);
    fuzz_check(res[0].number, H, "a key is mapped to a parameter or refused in one line naming the file");
    if (getenv("CK_FUZZ_VERBOSE")) fprintf(stderr, "%.*s\n", (int)res[1].len, res[1].string);
    fuzz_leave(1);
    return 0;
}
