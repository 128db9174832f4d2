/* ck_options.max_memory, as a host sets it: an arena, a graph or the Lua heap
 * that would pass it fails with CK_EMEM and a line naming the script line and
 * the limit; programs given back (closed or collected) make room again; a
 * caller built against the first layout of ck_options (its size ends before
 * max_memory) still opens, and gets the default; SIZE_MAX means no limit.
 * Prints one line per check and "N passed, M failed". */
#include "ck.h"
#include "host_check.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int has(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

/* a program of n floats in and n out: an arena of 8n bytes */
static const char *PROGRAM = "local ck = require 'ck'\n"
                             "function make(n)\n"
                             "  local g = ck.graph()\n"
                             "  return g:compile{outputs = {ck.silu(g:input('x', {n}))}}\n"
                             "end\n";

static ck_vm *open_with(size_t max_memory)
{
    ck_options o = CK_OPTIONS_INIT;
    o.max_memory = max_memory;
    ck_vm *vm = ck_open(&o);
    if (vm && ck_run_string(vm, PROGRAM, "prog.lua") != CK_OK) printf("# %s\n", ck_error(vm));
    return vm;
}

int main(void)
{
    ck_vm *vm = open_with(32u << 20);
    int st = ck_run_string(vm, "p = make(8 << 20)", "big.lua");
    check(st == CK_EMEM && has(ck_error(vm), "prog.lua:4: compile: ") &&
              has(ck_error(vm), "the program's arena of 64 MiB would pass the memory limit of 32 MiB (--max-memory 65MiB"),
          "an arena of 64 MiB under max_memory 32 MiB: CK_EMEM at the compile's line, prog.lua:4 (%d: %s)", st,
          ck_error(vm));
    st = ck_run_string(vm, "p = make(1 << 20)", "small.lua");
    check(st == CK_OK, "an arena of 8 MiB fits after the refusal (%s)", ck_error(vm));
    st = ck_run_string(vm, "q = {} for i = 1, 8 do q[i] = make(1 << 20) end", "many.lua");
    check(st == CK_EMEM && has(ck_error(vm), "prog.lua:4:") && has(ck_error(vm), "memory limit of 32 MiB"),
          "eight more programs of 8 MiB held at once: CK_EMEM (%s)", ck_error(vm));
    st = ck_run_string(vm, "q = nil p = nil collectgarbage() for i = 1, 3 do q = make(1 << 20) end", "again.lua");
    check(st == CK_OK, "once they are dropped, their memory comes back (%s)", ck_error(vm));
    st = ck_run_string(vm,
                       "local ck = require 'ck' local g = ck.graph() local x = g:input('x', {4})\n"
                       "for i = 1, 1e8 do x = ck.silu(x) end",
                       "nodes.lua");
    check(st == CK_EMEM && has(ck_error(vm), "nodes.lua:2:") && has(ck_error(vm), "memory limit of 32 MiB"),
          "a chain of nodes: CK_EMEM at nodes.lua:2 (%s)", ck_error(vm));
    st = ck_run_string(vm, "local t = {} for i = 1, 1e8 do t[i] = {i} end", "heap.lua");
    check(st == CK_EMEM && has(ck_error(vm), "heap.lua") && has(ck_error(vm), "memory limit of 32 MiB"),
          "the Lua heap counts in: CK_EMEM under a heap limit of 1 GiB (%s)", ck_error(vm));
    ck_close(vm);

    vm = open_with(SIZE_MAX);
    st = ck_run_string(vm, "p = make(16 << 20)", "none.lua");
    check(st == CK_OK, "SIZE_MAX: no limit, an arena of 128 MiB compiles (%s)", ck_error(vm));
    ck_close(vm);

    /* a caller of the first layout: its struct ends where max_memory starts */
    unsigned char old[sizeof(ck_options)];
    memset(old, 0xA5, sizeof old); /* what lies past its size is not its own */
    ck_options first = CK_OPTIONS_INIT;
    first.size = offsetof(ck_options, max_memory);
    memcpy(old, &first, offsetof(ck_options, max_memory));
    vm = ck_open((const ck_options *)old);
    check(vm && ck_status(vm) == CK_OK, "the first layout of ck_options opens (%s)", vm ? ck_error(vm) : "NULL");
    st = ck_run_string(vm, PROGRAM, "prog.lua");
    st = st ? st : ck_run_string(vm, "p = make(16 << 20)", "first.lua");
    check(st == CK_OK, "and gets the default, not the bytes past its size (%s)", ck_error(vm));
    ck_close(vm);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
