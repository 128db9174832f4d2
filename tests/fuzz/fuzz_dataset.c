/* libFuzzer harness for dataset samples: each input becomes the one sample of
 * a dataset folder (ds/000001.safetensors) that stdlib/ck/data.lua opens,
 * measures and loads into a small compiled program (latents [1,4,8,8],
 * prompt_embeds [1,8,16], pooled_prompt_embeds [1,16], time_ids [1,6],
 * noise [1,4,8,8]) with p:load_sample, the way training loads its batches.
 * A bad sample must end in a Lua error the script catches; the VM, opened
 * once, must stay healthy. */
#include "fuzz_util.h"

#include <ck.h>

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#define H "fuzz_dataset"

static ck_vm *vm;
static const char *const dirs[2] = {fuzz_dir, NULL};

static const char *setup =
    "local ck = require 'ck'\n"
    "local data = require 'ck.data'\n"
    "local g = ck.graph()\n"
    "local inputs = {\n"
    "  latents = g:input('latents', {1, 4, 8, 8}),\n"
    "  prompt_embeds = g:input('prompt_embeds', {1, 8, 16}),\n"
    "  pooled_prompt_embeds = g:input('pooled_prompt_embeds', {1, 16}),\n"
    "  time_ids = g:input('time_ids', {1, 6}),\n"
    "  noise = g:input('noise', {1, 4, 8, 8}),\n"
    "}\n"
    "local outs = {}\n"
    "for _, t in pairs(inputs) do outs[#outs + 1] = ck.silu(t) end\n"
    "local p = g:compile{outputs = outs}\n"
    "function load_one()\n"
    "  local ok, err = pcall(function()\n"
    "    local ds = data.latents('ds', {batch = 1, seed = 1})\n"
    "    ds:shapes()\n"
    "    local given = ds:load(p, inputs, ds:next_indices())\n"
    "    p:forward()\n"
    "    return given\n"
    "  end)\n"
    "  return ok, ok and '' or tostring(err)\n"
    "end\n";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_scratch("dataset");
    fuzz_enter();
    ck_options o = {0};
    o.heap_limit = 64u << 20;
    o.callback_budget = 1000000;
    o.no_default_dirs = 1;
    o.allow_read = dirs;
    o.allow_write = dirs;
    vm = ck_open(&o);
    if (!vm || ck_run_string(vm, setup, "fuzz_dataset") != CK_OK) {
        fprintf(stderr, H ": setup failed: %s\n", vm ? ck_error(vm) : "no VM");
        abort();
    }
    fuzz_leave(0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_enter();
    if (mkdir("ds", 0777) != 0 && errno != EEXIST) abort();
    FILE *fp = fopen("ds/000001.safetensors", "wb");
    if (!fp) abort();
    size_t put = fwrite(data, 1, size, fp);
    if (fclose(fp) != 0 || put != size) abort();
    ck_value res[2];
    int st = ck_call(vm, "load_one", 0, NULL, 2, res);
    fuzz_check(st == CK_OK, H, "a bad sample is an error the script catches");
    fuzz_check(res[0].type == CK_TBOOLEAN && res[1].type == CK_TSTRING, H, "load_one returns ok, message");
    if (!res[0].number) fuzz_check(res[1].len > 0, H, "a refused sample has a message");
    if (getenv("CK_FUZZ_VERBOSE")) fprintf(stderr, "%s\n", res[0].number ? "loaded" : res[1].string);
    fuzz_leave(0);
    return 0;
}
