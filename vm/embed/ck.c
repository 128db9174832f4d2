/* The public API of vm/ck.h: a VM is one Lua state with the ck module
 * preloaded, the stdlib on its path, its limits (vm/guard/runlimits.c) and its sandbox
 * (vm/guard/sandbox.c). Every call runs protected, so no Lua error (out of memory
 * included) ever escapes to the host; it becomes a status and one line. */
#define _GNU_SOURCE
#include "ck.h"
#include "guard/host.h"
#include "guard/runlimits.h"
#include "lua/lua_ck.h"
#include "guard/sandbox.h"
#include "guard/strlimits.h"
#include "guard/term.h"
#include "run/program.h"
#include "util/text.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef CK_STDLIB_DIR
#define CK_STDLIB_DIR "stdlib"
#endif

#define DEFAULT_SANDBOX_HEAP ((size_t)1 << 30)
#define DEFAULT_CALLBACK_BUDGET 100000000LL

int luaopen_ck(lua_State *L);

struct ck_model {
    ck_vm *vm;
    int ref;            /* the program, in the registry */
    ck_model *prev, *next;
    double loss;
    double last_s, total_s;
    int64_t timed;
};

struct ck_vm {
    _Atomic unsigned magic; /* VM_MAGIC while open, VM_CLOSING in ck_close, then 0 */
    ck_vm *closed_next; /* in the list of closed handles kept back from free */
    lua_State *L;
    lua_Alloc alloc;
    void *alloc_ud;
    ck_host host;       /* what the scripts' bindings read (vm/guard/host.h) */
    int stdout_ref;     /* io.stdout's stand-in with a log callback, in the registry */
    int results_ref;    /* strings the last call returned, kept alive, in the registry */
    void (*log)(void *ud, const char *text, size_t len);
    void *log_ud;
    int warn_cont;
    int default_dirs;
    int dead;           /* bad options: every call fails with `status` */
    int status;
    lua_Integer seed;
    ck_model *models;
    char chunk[256];    /* the script of the running call, for messages without a line */
    char err[1024];
};

const char *ck_version(void) { return CK_VERSION; }

int ck_version_num(void) { return CK_VERSION_NUM; }

const char *ck_errstr(int code)
{
    switch (code) {
    case CK_OK: return "CK_OK: no error";
    case CK_EFILE: return "CK_EFILE: a script or data file cannot be read";
    case CK_ESYNTAX: return "CK_ESYNTAX: a Lua syntax error";
    case CK_ERUN: return "CK_ERUN: an error raised while the script ran";
    case CK_EMEM: return "CK_EMEM: out of memory, or over the Lua heap limit";
    case CK_EARG: return "CK_EARG: a bad argument to the API";
    case CK_EINTR: return "CK_EINTR: stopped by ck_interrupt()";
    case CK_ELIMIT: return "CK_ELIMIT: a callback ran past its instruction budget";
    case CK_EDENIED: return "CK_EDENIED: the sandbox refused a file, a function or a binary chunk";
    case CK_EINVAL: return "CK_EINVAL: a handle that is closed or was never opened";
    default: return "unknown status";
    }
}

/* ---- live handles
 * Every handle ck_open returns is in the registry until ck_close has closed its
 * Lua state; each entry point looks its handle up first and answers CK_EINVAL
 * for one that is not there (closed, or never opened), without reading
 * through it. The lookup takes no lock (ck_interrupt may run in a signal
 * handler): slots are atomic pointers in blocks that are never
 * freed. A handle's memory is pages at an address no handle had before, taken
 * in turn from a range of address space reserved for them (HANDLE_SPACE, or
 * 1/32 of a limit on address space) and handed back to the kernel but never
 * mapped again once freed, so a stale pointer can never name a newer VM or
 * model; past the range, malloc's. A closed VM's handle is kept back from
 * free: the last CLOSED_KEPT of them always (a call racing with the close may
 * still read the one it found), and all of them while a SIGTERM handler is
 * running (it may hold a pointer to the VM's host it read before the host was
 * taken out of guard/term.c's list). The models of every VM are linked and unlinked under reg_mu,
 * which live_model holds while it walks them. */
#define VM_MAGIC 0x636b766du
#define VM_CLOSING 0x636b7663u
#define REG_SLOTS 64
#define CLOSED_KEPT 16
#define HANDLE_SPACE ((size_t)16 << 30)

typedef struct reg_block {
    _Atomic(ck_vm *) slot[REG_SLOTS];
    _Atomic(struct reg_block *) next;
} reg_block;

static reg_block reg_head;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static ck_vm *reg_closed;       /* closed handles kept, newest first */

static char *handle_base;  /* the reserved range: NULL until the first open, MAP_FAILED when none */
static size_t handle_space; /* its size: HANDLE_SPACE, or less under a limit on address space */
static size_t handle_used;  /* bytes of it handed out, never handed out again */

static size_t handle_bytes(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (size + page - 1) / page * page;
}

static int handle_mapped(const void *h)
{
    const char *p = h;
    return handle_base && handle_base != MAP_FAILED && p >= handle_base && p < handle_base + handle_space;
}

/* LeakSanitizer scans no mapping of ours, so live handles in the range are
 * declared roots of the heap they point into (weak: without LSan, no call) */
extern void __lsan_register_root_region(const void *p, size_t size) __attribute__((weak));
extern void __lsan_unregister_root_region(const void *p, size_t size) __attribute__((weak));

/* size zeroed bytes for a new handle (under reg_mu), or NULL */
static void *handle_new(size_t size)
{
    size_t n = handle_bytes(size);
    if (!handle_base) {
        /* a process with a limit on its address space spends at most 1/32 of it here */
        struct rlimit as;
        handle_space = HANDLE_SPACE;
        if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur / 32 < handle_space)
            handle_space = (size_t)(as.rlim_cur / 32) / n * n;
        void *p = handle_space ? mmap(NULL, handle_space, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                               : MAP_FAILED;
        handle_base = p == MAP_FAILED ? MAP_FAILED : p;
    }
    if (handle_base != MAP_FAILED && handle_used + n <= handle_space) {
        char *p = handle_base + handle_used;
        if (mprotect(p, n, PROT_READ | PROT_WRITE) == 0) { /* fresh pages: zeros */
            handle_used += n;
            if (__lsan_register_root_region) __lsan_register_root_region(p, n);
            return p;
        }
    }
    return calloc(1, size);
}

/* under reg_mu */
static void handle_free(void *h, size_t size)
{
    if (!handle_mapped(h)) {
        free(h);
        return;
    }
    size_t n = handle_bytes(size);
    if (__lsan_unregister_root_region) __lsan_unregister_root_region(h, n);
    madvise(h, n, MADV_DONTNEED);
    mprotect(h, n, PROT_NONE);
}

static int reg_has(const void *vm)
{
    if (!vm) return 0;
    for (reg_block *b = &reg_head; b; b = atomic_load(&b->next))
        for (int i = 0; i < REG_SLOTS; i++)
            if ((const void *)atomic_load(&b->slot[i]) == vm) return 1;
    return 0;
}

/* a new handle, zeroed and in the registry; NULL when out of memory */
static ck_vm *reg_new(void)
{
    pthread_mutex_lock(&reg_mu);
    ck_vm *vm = handle_new(sizeof *vm);
    for (reg_block *b = &reg_head; vm; b = atomic_load(&b->next)) {
        for (int i = 0; i < REG_SLOTS; i++)
            if (!atomic_load(&b->slot[i])) {
                atomic_store(&b->slot[i], vm);
                pthread_mutex_unlock(&reg_mu);
                return vm;
            }
        if (!atomic_load(&b->next)) {
            reg_block *nb = calloc(1, sizeof *nb);
            if (!nb) {
                handle_free(vm, sizeof *vm);
                vm = NULL;
                break;
            }
            atomic_store(&b->next, nb);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return NULL;
}

/* takes vm out of the registry */
static void reg_remove(ck_vm *vm)
{
    pthread_mutex_lock(&reg_mu);
    for (reg_block *b = &reg_head; b; b = atomic_load(&b->next))
        for (int i = 0; i < REG_SLOTS; i++)
            if (atomic_load(&b->slot[i]) == vm) atomic_store(&b->slot[i], NULL);
    pthread_mutex_unlock(&reg_mu);
}

/* keeps the closed handle vm, freeing kept ones past what is needed; vm is
 * out of the registry, so a handler that starts from now on cannot reach it */
static void reg_retire(ck_vm *vm)
{
    pthread_mutex_lock(&reg_mu);
    atomic_store(&vm->magic, 0);
    vm->closed_next = reg_closed;
    reg_closed = vm;
    if (!ck_term_busy()) {
        ck_vm *p = reg_closed;
        for (int k = 1; p && k < CLOSED_KEPT; k++) p = p->closed_next;
        if (p) {
            ck_vm *rest = p->closed_next;
            p->closed_next = NULL;
            while (rest) {
                ck_vm *n = rest->closed_next;
                handle_free(rest, sizeof *rest);
                rest = n;
            }
        }
    }
    pthread_mutex_unlock(&reg_mu);
}

/* the VM of an open handle, else NULL */
static ck_vm *live_vm(const ck_vm *vm)
{
    return reg_has(vm) && atomic_load(&vm->magic) == VM_MAGIC ? (ck_vm *)vm : NULL;
}

/* m when it is an open model of an open VM (looked up, never read through first) */
static ck_model *live_model(const ck_model *m)
{
    if (!m) return NULL;
    pthread_mutex_lock(&reg_mu);
    ck_model *found = NULL;
    for (reg_block *b = &reg_head; b && !found; b = atomic_load(&b->next))
        for (int i = 0; i < REG_SLOTS && !found; i++) {
            ck_vm *vm = atomic_load(&b->slot[i]);
            for (ck_model *x = vm ? vm->models : NULL; x; x = x->next)
                if (x == m) {
                    found = x;
                    break;
                }
        }
    pthread_mutex_unlock(&reg_mu);
    return found;
}

/* ---- the sizes of the caller's structs (ck.h, "Versions and sizes")
 * Each struct's first layout is its whole size in this version: a later one
 * appends fields and accepts every size it has known. 0 reads as the first. */
#define OPTIONS_V1 offsetof(ck_options, max_memory)
#define OPTIONS_V2 sizeof(ck_options)
/* ck_plan_request has had two layouts: the first lacks world_size */
#define PLAN_REQUEST_V1 offsetof(ck_plan_request, world_size)
#define PLAN_REQUEST_V2 sizeof(ck_plan_request)
#define PLAN_INFO_V1 sizeof(ck_plan_info)
#define METRICS_V1 sizeof(ck_metrics)

/* the bytes of a caller's struct to read or write, or 0 with msg when its size
 * is one this library does not know */
static size_t known_size(size_t size, size_t v1, const char *what, char *msg, size_t len)
{
    if (size == 0) return v1;
    if (size == v1) return size;
    snprintf(msg, len, "%s.size is %zu, a size this library (ckrun %s) does not know: it takes %zu, "
             "sizeof(%s) in its ck.h (start from CK_%s_INIT)", what, size, CK_VERSION, v1, what,
             !strcmp(what, "ck_options") ? "OPTIONS" : !strcmp(what, "ck_plan_request") ? "PLAN_REQUEST"
             : !strcmp(what, "ck_plan_info") ? "PLAN_INFO" : "METRICS");
    return 0;
}

int ck_device_available(const char *name)
{
    if (name && !strcmp(name, "cpu")) return 1;
    return name && !strcmp(name, "cuda") && ck_cuda_devices() > 0;
}

/* ---- printing through the log callback */

static void vm_log(ck_vm *vm, const char *s, size_t n) { vm->log(vm->log_ud, s, n); }

static int l_print(lua_State *L)
{
    ck_vm *vm = lua_touserdata(L, lua_upvalueindex(1));
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_addchar(&b, '\n');
    luaL_pushresult(&b);
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    vm_log(vm, s, len);
    return 0;
}

/* io.write(...) and the write method of io.stdout and io.stderr (upvalue 2
 * true): strings and numbers, as io.write formats them */
static int l_log_write(lua_State *L)
{
    ck_vm *vm = lua_touserdata(L, lua_upvalueindex(1));
    int method = lua_toboolean(L, lua_upvalueindex(2));
    int n = lua_gettop(L);
    for (int i = method ? 2 : 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_checklstring(L, i, &len);
        vm_log(vm, s, len);
    }
    if (method) lua_settop(L, 1);
    else lua_rawgeti(L, LUA_REGISTRYINDEX, vm->stdout_ref);
    return 1;
}

static int l_log_self(lua_State *L)
{
    lua_settop(L, 1);
    return 1;
}

static int l_log_noclose(lua_State *L)
{
    luaL_pushfail(L);
    lua_pushliteral(L, "cannot close standard file");
    return 2;
}

static int l_log_unreadable(lua_State *L)
{
    luaL_pushfail(L);
    lua_pushliteral(L, "the log is not readable");
    return 2;
}

static int l_log_setvbuf(lua_State *L)
{
    lua_pushboolean(L, 1);
    return 1;
}

/* a stand-in for io.stdout / io.stderr that writes to the log */
static void push_log_file(lua_State *L, ck_vm *vm)
{
    lua_createtable(L, 0, 6);
    lua_pushlightuserdata(L, vm);
    lua_pushboolean(L, 1);
    lua_pushcclosure(L, l_log_write, 2);
    lua_setfield(L, -2, "write");
    lua_pushcfunction(L, l_log_self);
    lua_setfield(L, -2, "flush");
    lua_pushcfunction(L, l_log_noclose);
    lua_setfield(L, -2, "close");
    lua_pushcfunction(L, l_log_setvbuf);
    lua_setfield(L, -2, "setvbuf");
    lua_pushcfunction(L, l_log_unreadable);
    lua_setfield(L, -2, "read");
    lua_pushcfunction(L, l_log_unreadable);
    lua_setfield(L, -2, "lines");
}

static void warnf(void *ud, const char *msg, int tocont)
{
    ck_vm *vm = ud;
    if (!vm->warn_cont && msg[0] == '@') return; /* control messages */
    if (vm->log) {
        if (!vm->warn_cont) vm_log(vm, "Lua warning: ", 13);
        vm_log(vm, msg, strlen(msg));
        if (!tocont) vm_log(vm, "\n", 1);
    }
    vm->warn_cont = tocont;
}

/* ---- where the stdlib is: beside an installed library, else the build's */

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void default_stdlib(char *buf, size_t len)
{
    Dl_info info;
    char obj[PATH_MAX], cand[PATH_MAX + 64];
    obj[0] = 0;
    if (dladdr((void *)&ck_open, &info) && info.dli_fname && strstr(info.dli_fname, ".so")) {
        if (!realpath(info.dli_fname, obj)) obj[0] = 0;
    } else {
        ssize_t n = readlink("/proc/self/exe", obj, sizeof obj - 1);
        obj[n > 0 ? n : 0] = 0;
    }
    char *slash = strrchr(obj, '/');
    if (slash) {
        *slash = 0;
        /* PREFIX/bin/ckrun, PREFIX/lib/libck.so, PREFIX/lib/<arch>/libck.so */
        static const char *const rel[] = {"/../share/lua/5.4", "/../../share/lua/5.4"};
        for (int i = 0; i < 2; i++) {
            snprintf(cand, sizeof cand, "%s%s/ck", obj, rel[i]);
            if (is_dir(cand)) {
                cand[strlen(cand) - 3] = 0;
                if (realpath(cand, buf)) return;
            }
        }
    }
#ifdef CK_STDLIB_INSTALL_DIR
    if (!is_dir(CK_STDLIB_DIR "/ck") && is_dir(CK_STDLIB_INSTALL_DIR "/ck")) {
        snprintf(buf, len, "%s", CK_STDLIB_INSTALL_DIR);
        return;
    }
#endif
    snprintf(buf, len, "%s", CK_STDLIB_DIR);
}

/* ---- errors */

static int has_location(const char *s)
{
    for (const char *p = strchr(s, ':'); p; p = strchr(p + 1, ':')) {
        const char *q = p + 1;
        while (*q >= '0' && *q <= '9') q++;
        if (q > p + 1 && *q == ':') return 1;
    }
    return 0;
}

/* msg on one line: following lines joined with "; " (no traceback) */
static void one_line(char *dst, size_t len, const char *msg)
{
    size_t k = 0;
    int sep = 0;
    for (const char *p = msg; *p && k + 3 < len; p++) {
        if (*p == '\n' || *p == '\r') {
            if (!strncmp(p + 1, "stack traceback:", 16)) break;
            sep = 1;
            continue;
        }
        if (sep) {
            if (*p == '\t' || *p == ' ') continue;
            if (k && dst[k - 1] != ':') dst[k++] = ';';
            dst[k++] = ' ';
            sep = 0;
        }
        dst[k++] = *p;
    }
    dst[k] = 0;
}

static int set_error(ck_vm *vm, int code, const char *msg)
{
    char line[sizeof vm->err];
    one_line(line, sizeof line, msg && *msg ? msg : "unknown error");
    const char *oom = strstr(line, "not enough memory");
    if (code == CK_EMEM && oom) {
        char what[160], size[64];
        if (vm->host.lim.mem_refused) {
            ck_mem_text(vm->host.lim.mem.limit, size, sizeof size);
            snprintf(what, sizeof what, "out of memory (the memory limit of %s is reached; --max-memory allows more)",
                     size);
        } else if (vm->host.lim.heap_limit) {
            ck_bytes_text(vm->host.lim.heap_limit, size, sizeof size);
            snprintf(what, sizeof what, "out of memory (the Lua heap limit of %s is reached)", size);
        } else {
            snprintf(what, sizeof what, "out of memory");
        }
        snprintf(vm->err, sizeof vm->err, "%s%s%.*s%s%s", has_location(line) || !vm->chunk[0] ? "" : vm->chunk,
                 has_location(line) || !vm->chunk[0] ? "" : ": ", (int)(oom - line), line, what,
                 oom + strlen("not enough memory"));
    } else {
        snprintf(vm->err, sizeof vm->err, "%s", line);
    }
    vm->status = code;
    return code;
}

static ck_vm *dead(ck_vm *vm, int code, const char *msg)
{
    vm->dead = 1;
    set_error(vm, code, msg);
    return vm;
}

/* the message handler: strings as they are, other error values named */
static int msgh(lua_State *L)
{
    if (lua_type(L, 1) == LUA_TSTRING) return 1;
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    char w[256];
    ck_lua_where(L, w, sizeof w);
    lua_pushfstring(L, "%s: (error object is a %s value)", w, luaL_typename(L, 1));
    return 1;
}

/* Every protected call gets one of these first in its argument struct: the
 * function may set code before it raises, to give the error its status. */
typedef struct call {
    ck_vm *vm;
    int code;
} call;

static int classify(ck_vm *vm, int st, const char *msg, int hint)
{
    if (vm->host.lim.tripped) return vm->host.lim.tripped;
    /* a memory error from a build refused for the pending interrupt */
    if (vm->host.lim.interrupt_refused && vm->host.lim.interrupt) return CK_EINTR;
    int c = ck_limits_code_of(&vm->host.lim, msg);
    if (c) return c;
    if (hint) return hint;
    if (st == LUA_ERRMEM || (vm->host.lim.heap_refused && msg && strstr(msg, "not enough memory"))) return CK_EMEM;
    if (vm->host.lim.mem.refused && msg && strstr(msg, "would pass the memory limit of")) return CK_EMEM;
    if (vm->host.lim.interrupt) return CK_EINTR;
    return CK_ERUN;
}

static int protected(ck_vm *vm, lua_CFunction f, call *c, const char *chunk)
{
    if (vm->dead) return vm->status;
    lua_State *L = vm->L;
    vm->err[0] = 0;
    if (chunk) snprintf(vm->chunk, sizeof vm->chunk, "%s", chunk);
    if (vm->host.lim.interrupt) {
        atomic_store(&vm->host.lim.interrupt, 0);
        return set_error(vm, CK_EINTR, "interrupted");
    }
    int base = lua_gettop(L);
    lua_pushcfunction(L, msgh);
    lua_pushcfunction(L, f);
    lua_pushlightuserdata(L, c);
    int st = lua_pcall(L, 1, 0, base + 1);
    int code = CK_OK;
    if (st != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        code = classify(vm, st, msg, c->code);
        if (vm->host.lim.tripped) msg = vm->host.lim.noted;
        char intr[sizeof vm->chunk + 16];
        if (!vm->host.lim.tripped && code == CK_EINTR && vm->host.lim.interrupt_refused) {
            /* the refused build's memory error carries no line */
            snprintf(intr, sizeof intr, "%s%sinterrupted", vm->chunk, vm->chunk[0] ? ": " : "");
            msg = intr;
        }
        set_error(vm, code, msg);
        if (code == CK_EINTR) atomic_store(&vm->host.lim.interrupt, 0);
    }
    lua_settop(L, base);
    ck_limits_reset(&vm->host.lim);
    vm->status = code;
    return code;
}

/* raises an argument error: status CK_EARG */
static int arg_error(lua_State *L, call *c, const char *fmt, const char *s)
{
    c->code = CK_EARG;
    return luaL_error(L, fmt, s);
}

/* ---- opening */

static void *default_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    (void)osize;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, nsize);
}

static int open_ck(lua_State *L)
{
    luaopen_ck(L);
    if (lua_toboolean(L, lua_upvalueindex(1))) ck_sandbox_lock_metatables(L);
    return 1;
}

typedef struct setup {
    call c;
    const char *stdlib;
} setup;

static int p_setup(lua_State *L)
{
    setup *a = lua_touserdata(L, 1);
    ck_vm *vm = a->c.vm;
    luaL_openlibs(L);
    ck_host_install(L, &vm->host);
    ck_limits_install(L, &vm->host.lim);
    ck_strlimits_install(L);
    lua_setwarnf(L, warnf, vm);
    lua_getglobal(L, "math");
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, vm->seed);
    lua_call(L, 1, 0);
    lua_pop(L, 1);
    if (vm->host.sb.on) ck_sandbox_install(L, vm->seed);
    lua_newtable(L);
    vm->results_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushboolean(L, vm->host.sb.on);
    lua_pushcclosure(L, open_ck, 1);
    lua_setfield(L, -2, "ck");
    lua_pop(L, 1);
    /* the stdlib first on package.path */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", a->stdlib, a->stdlib, lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
    if (vm->log) {
        lua_pushlightuserdata(L, vm);
        lua_pushcclosure(L, l_print, 1);
        lua_setglobal(L, "print");
        lua_getglobal(L, "io");
        push_log_file(L, vm);
        lua_pushvalue(L, -1);
        vm->stdout_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        lua_setfield(L, -2, "stdout");
        push_log_file(L, vm);
        lua_setfield(L, -2, "stderr");
        lua_pushlightuserdata(L, vm);
        lua_pushboolean(L, 0);
        lua_pushcclosure(L, l_log_write, 2);
        lua_setfield(L, -2, "write");
        lua_pop(L, 1);
    }
    return 0;
}

/* a copy of s from the VM's allocator (NULL: none), into *out; 0, or -1 */
static int copy_string(ck_vm *vm, const char *s, char **out)
{
    *out = NULL;
    if (!s) return 0;
    size_t n = strlen(s) + 1;
    if (!(*out = vm->alloc(vm->alloc_ud, NULL, 0, n))) return -1;
    memcpy(*out, s, n);
    return 0;
}

static void free_string(ck_vm *vm, char *s)
{
    if (s) vm->alloc(vm->alloc_ud, s, strlen(s) + 1, 0);
}

/* 1 when path names a directory: spelled as one (empty, a trailing '/', a
 * last component "." or "..") or one now */
static int names_dir(const char *path)
{
    size_t n = strlen(path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!n || path[n - 1] == '/' || !strcmp(base, ".") || !strcmp(base, "..")) return 1;
    return is_dir(path);
}

ck_vm *ck_open(const ck_options *opt) { return ck_open_plan(opt, NULL); }

ck_vm *ck_open_plan(const ck_options *opt, const ck_plan_request *plan)
{
    ck_options o;
    ck_plan_request req;
    memset(&o, 0, sizeof o);
    memset(&req, 0, sizeof req);
    char msg[PATH_MAX + 128];
    /* ck_options has had two layouts: the first lacks max_memory */
    size_t osize = !opt ? sizeof o : !opt->size || opt->size == OPTIONS_V1 ? OPTIONS_V1
                 : known_size(opt->size, OPTIONS_V2, "ck_options", msg, sizeof msg);
    size_t rsize = !plan || !osize ? 1
                 : plan->size == PLAN_REQUEST_V1 ? PLAN_REQUEST_V1
                 : known_size(plan->size, PLAN_REQUEST_V2, "ck_plan_request", msg, sizeof msg);
    if (opt && osize) memcpy(&o, opt, osize);
    if (plan && rsize) memcpy(&req, plan, rsize);
    /* options of an unknown size: nothing in them can be trusted, the allocator included */
    lua_Alloc alloc = osize && o.alloc ? o.alloc : default_alloc;
    void *alloc_ud = osize ? o.alloc_ud : NULL;
    ck_vm *vm = reg_new();
    if (!vm) return NULL;
    atomic_store(&vm->magic, VM_MAGIC);
    if (ck_term_register(&vm->host)) return dead(vm, CK_EMEM, "out of memory");
    vm->alloc = alloc;
    vm->alloc_ud = alloc_ud;
    vm->stdout_ref = vm->results_ref = LUA_NOREF;
    if (!osize || !rsize) return dead(vm, CK_EARG, msg);
    ck_host *h = &vm->host;
    if (plan) {
        h->planning = 1;
        h->plan_only = req.plan_only;
        h->json = req.json;
        h->plan_max_batch = req.max_batch > 0 ? req.max_batch : 0;
        h->plan_world_size = req.world_size > 0 ? req.world_size : 0;
        if (copy_string(vm, req.policies, &h->plan_policies) || copy_string(vm, req.svg, &h->plan_svg) ||
            copy_string(vm, req.export_graph, &h->plan_export_graph))
            return dead(vm, CK_EMEM, "out of memory");
    }
    vm->log = o.log;
    vm->log_ud = o.log_ud;
    vm->seed = (lua_Integer)o.seed;
    vm->default_dirs = !o.no_default_dirs;
    vm->host.lim.alloc = alloc;
    vm->host.lim.alloc_ud = o.alloc_ud;
    vm->host.lim.heap_limit = o.heap_limit == SIZE_MAX ? 0 : o.heap_limit ? o.heap_limit : o.trust ? 0 : DEFAULT_SANDBOX_HEAP;
    if (o.max_memory == SIZE_MAX || (!o.max_memory && o.trust)) {
        vm->host.lim.mem.limit = 0;
    } else if (o.max_memory) {
        vm->host.lim.mem.limit = o.max_memory;
    } else {
        /* the sandbox's default: no more than the machine has */
        const long long total = ck_proc_kb_field("/proc/meminfo", "MemTotal");
        vm->host.lim.mem.limit = total > 0 ? (size_t)total : 0;
        vm->host.lim.mem.add_device = 1;
    }
    vm->host.lim.budget = o.callback_budget < 0 ? -1 : o.callback_budget ? o.callback_budget : DEFAULT_CALLBACK_BUDGET;
    vm->host.sb.on = !o.trust;
    vm->host.sb.alloc = alloc;
    vm->host.sb.alloc_ud = o.alloc_ud;
    /* a device named outright opens now, so that a missing one fails here;
     * auto only looks (the GPU opens when a program first compiles for it) */
    if (!o.device || !strcmp(o.device, "auto")) {
        snprintf(vm->host.device, sizeof vm->host.device, "%s", ck_program_default_device());
    } else {
        const ck_backend *be = ck_program_backend_find(o.device, h->plan_only, msg, sizeof msg);
        if (!be) return dead(vm, CK_EARG, msg);
        snprintf(vm->host.device, sizeof vm->host.device, "%s", be->name);
    }
    if (o.nondeterministic && !strcmp(vm->host.device, "cuda") && !h->plan_only && ck_cuda_configure(0, -1, msg, sizeof msg))
        return dead(vm, CK_EARG, msg);
    char stdlib[PATH_MAX];
    if (o.stdlib_dir) snprintf(stdlib, sizeof stdlib, "%s", o.stdlib_dir);
    else default_stdlib(stdlib, sizeof stdlib);
    /* every file the command line names for output is a file: one that
     * names a directory is refused, sandbox or not (in the sandbox it would
     * be a door to that directory) */
    const char *files[] = {h->plan_svg, h->plan_export_graph};
    const char *flags[] = {"--svg", "--export-graph"};
    for (int k = 0; k < 2; k++)
        if (files[k] && names_dir(files[k])) {
            snprintf(msg, sizeof msg, "%s '%s' names a directory: it takes the file to write", flags[k], files[k]);
            return dead(vm, CK_EARG, msg);
        }
    if (vm->host.sb.on) {
        if (vm->default_dirs && ck_sandbox_allow(&vm->host.sb, ".", 1))
            return dead(vm, errno == ENOMEM ? CK_EMEM : CK_EARG, "cannot resolve the working directory for the sandbox");
        for (int w = 0; w < 2; w++) {
            const char *const *list = w ? o.allow_write : o.allow_read;
            for (int i = 0; list && list[i]; i++) {
                if (!list[i][0] || ck_sandbox_allow(&vm->host.sb, list[i], w)) {
                    snprintf(msg, sizeof msg, "cannot allow %s '%s': %s", w ? "writing under" : "reading under", list[i],
                             list[i][0] ? strerror(errno) : "empty path");
                    return dead(vm, errno == ENOMEM ? CK_EMEM : CK_EARG, msg);
                }
            }
        }
        /* the plan's --svg and --export-graph files: those files (and their
         * temp files), not their directories */
        for (int k = 0; k < 2; k++)
            if (files[k] && ck_sandbox_allow_file(&vm->host.sb, files[k], 1)) {
                snprintf(msg, sizeof msg, "cannot allow writing %s '%s': %s", flags[k], files[k], strerror(errno));
                return dead(vm, errno == ENOMEM ? CK_EMEM : CK_EARG, msg);
            }
        if (is_dir(stdlib) && ck_sandbox_set_lib(&vm->host.sb, stdlib)) return dead(vm, CK_EMEM, "out of memory");
    }
    vm->L = lua_newstate(ck_limits_alloc, &vm->host.lim);
    if (!vm->L) return dead(vm, CK_EMEM, "out of memory: cannot start Lua");
    setup s = {{vm, 0}, stdlib};
    lua_pushcfunction(vm->L, p_setup);
    lua_pushlightuserdata(vm->L, &s);
    int st = lua_pcall(vm->L, 1, 0, 0);
    if (st != LUA_OK) {
        snprintf(msg, sizeof msg, "cannot start the VM: %s", st == LUA_ERRMEM ? "not enough memory" : lua_tostring(vm->L, -1));
        lua_close(vm->L);
        vm->L = NULL;
        return dead(vm, st == LUA_ERRMEM ? CK_EMEM : CK_ERUN, msg);
    }
    vm->status = CK_OK;
    return vm;
}

/* Lua code that runs while the state closes (finalizers, and what they call)
 * runs as one callback: under the VM's callback budget (CLOSE_BUDGET
 * instructions where the host set none), and ck_interrupt still stops it.
 * Lua runs the body of a finalizer with hooks off, so what this bounds is the
 * coroutines a finalizer resumes and the C loops that charge the budget
 * (ck_limits_charge); a finalizer's own loop nothing can stop, which is why
 * the sandbox lets no script install one. */
#define CLOSE_BUDGET DEFAULT_CALLBACK_BUDGET

static void limit_close(ck_limits *lim)
{
    ck_limits_reset(lim);
    atomic_store(&lim->interrupt, 0); /* one meant for a call, not for the close */
    if (lim->budget < 0) lim->budget = CLOSE_BUDGET;
    lim->depth = 1;
    lim->used = 0;
}

void ck_close(ck_vm *vm)
{
    unsigned open = VM_MAGIC;
    /* NULL, closed, never opened, or being closed by another call */
    if (!reg_has(vm) || !atomic_compare_exchange_strong(&vm->magic, &open, VM_CLOSING)) return;
    pthread_mutex_lock(&reg_mu);
    for (ck_model *m = vm->models, *next; m; m = next) {
        next = m->next;
        handle_free(m, sizeof *m);
    }
    vm->models = NULL;
    pthread_mutex_unlock(&reg_mu);
    if (vm->L) {
        limit_close(&vm->host.lim);
        lua_close(vm->L);
    }
    vm->L = NULL;
    ck_term_unregister(&vm->host);
    reg_remove(vm);
    ck_sandbox_free(&vm->host.sb);
    free_string(vm, vm->host.plan_policies);
    free_string(vm, vm->host.plan_svg);
    free_string(vm, vm->host.plan_export_graph);
    reg_retire(vm);
}

int ck_status(const ck_vm *vm)
{
    if (!vm) return CK_EARG;
    return live_vm(vm) ? vm->status : CK_EINVAL;
}

const char *ck_error(const ck_vm *vm)
{
    if (!vm) return "no VM";
    return live_vm(vm) ? vm->err : "a closed VM handle, or one ck_open never returned";
}

void ck_interrupt(ck_vm *vm)
{
    if (!reg_has(vm)) return;
    unsigned magic = atomic_load(&vm->magic);
    if (magic == VM_MAGIC || magic == VM_CLOSING) atomic_store(&vm->host.lim.interrupt, 1);
}

/* ---- running scripts */

static void push_arg_value(lua_State *L, const char *v)
{
    if (lua_stringtonumber(L, v) == 0) lua_pushstring(L, v);
}

/* key and value on top, the args table at t: where t already holds key, the
 * value joins getmetatable(t).repeated[key] (made with the earlier value) */
static void record_repeat(lua_State *L, int t)
{
    lua_pushvalue(L, -2);
    lua_rawget(L, t);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_getmetatable(L, t);
    lua_getfield(L, -1, "repeated");
    lua_pushvalue(L, -5); /* key */
    lua_rawget(L, -2);
    if (lua_isnil(L, -1)) { /* the first repeat: a list of the earlier value */
        lua_pop(L, 1);
        lua_createtable(L, 4, 0);
        lua_pushvalue(L, -4);
        lua_rawseti(L, -2, 1);
        lua_pushvalue(L, -6);
        lua_pushvalue(L, -2);
        lua_rawset(L, -4);
    }
    lua_pushvalue(L, -5); /* value */
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 4);
}

static int refuse_binary(lua_State *L, call *c, const char *what)
{
    c->code = CK_EDENIED;
    return luaL_error(L, "%s: binary chunks are refused in the sandbox; run Lua source (ckrun --trust allows them)", what);
}

/* after a failed load: the message on top, its status as the call's */
static int load_error(lua_State *L, call *c, int st, const char *what)
{
    const char *m = lua_tostring(L, -1);
    if (st == LUA_ERRSYNTAX && m && strstr(m, "attempt to load a binary chunk")) return refuse_binary(L, c, what);
    c->code = st == LUA_ERRSYNTAX ? CK_ESYNTAX : st == LUA_ERRMEM ? CK_EMEM : CK_EFILE;
    return lua_error(L);
}

typedef struct runfile {
    call c;
    const char *path;
    int argc;
    const char *const *argv;
} runfile;

static int p_run_file(lua_State *L)
{
    runfile *a = lua_touserdata(L, 1);
    ck_vm *vm = a->c.vm;
    FILE *f = fopen(a->path, "rb");
    if (!f) {
        a->c.code = CK_EFILE;
        return luaL_error(L, "cannot open script '%s': %s", a->path, strerror(errno));
    }
    fclose(f);
    int st = luaL_loadfilex(L, a->path, vm->host.sb.on ? "t" : "bt");
    if (st != LUA_OK) return load_error(L, &a->c, st, a->path);
    /* the script may read beside itself */
    if (vm->host.sb.on && vm->default_dirs) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", a->path);
        char *s = strrchr(dir, '/');
        if (s) *s = 0;
        if (ck_sandbox_allow(&vm->host.sb, s ? (dir[0] ? dir : "/") : ".", 0) && errno == ENOMEM)
            return luaL_error(L, "not enough memory");
    }
    /* args table: --key value pairs and positional words; a key given more
     * than once keeps its last value, and getmetatable(args).repeated[key]
     * lists every value in order (ck.options takes them for options that
     * repeat, and refuses a repeat of any other) */
    lua_newtable(L);
    lua_newtable(L); /* the metatable */
    lua_newtable(L);
    lua_setfield(L, -2, "repeated");
    lua_setmetatable(L, -2);
    int pos = 0;
    for (int i = 0; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (s[0] == '-' && s[1] == '-' && s[2]) {
            const char *key = s + 2, *eq = strchr(key, '=');
            if (eq) {
                lua_pushlstring(L, key, (size_t)(eq - key));
                push_arg_value(L, eq + 1);
            } else if (i + 1 < a->argc && !(a->argv[i + 1][0] == '-' && a->argv[i + 1][1] == '-')) {
                lua_pushstring(L, key);
                push_arg_value(L, a->argv[++i]);
            } else {
                lua_pushstring(L, key);
                lua_pushboolean(L, 1);
            }
            record_repeat(L, lua_gettop(L) - 2);
            lua_settable(L, -3);
        } else {
            push_arg_value(L, s);
            lua_rawseti(L, -2, ++pos);
        }
    }
    lua_pushstring(L, a->path);
    lua_setfield(L, -2, "script");
    lua_pushvalue(L, -1);
    lua_setglobal(L, "args");
    lua_call(L, 1, 0);
    return 0;
}

int ck_run_file(ck_vm *vm, const char *path, int argc, const char *const *argv)
{
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!path || argc < 0 || (argc > 0 && !argv)) return set_error(vm, CK_EARG, "ck_run_file: no script path");
    for (int i = 0; i < argc; i++)
        if (!argv[i]) return set_error(vm, CK_EARG, "ck_run_file: argv holds a NULL entry");
    runfile a = {{vm, 0}, path, argc, argv};
    return protected(vm, p_run_file, &a.c, path);
}

typedef struct runstring {
    call c;
    const char *code;
    const char *name;
} runstring;

static int p_run_string(lua_State *L)
{
    runstring *a = lua_touserdata(L, 1);
    ck_vm *vm = a->c.vm;
    size_t len = strlen(a->code);
    lua_pushfstring(L, "=%s", a->name);
    if (vm->host.sb.on && len && a->code[0] == LUA_SIGNATURE[0]) return refuse_binary(L, &a->c, a->name);
    int st = luaL_loadbufferx(L, a->code, len, lua_tostring(L, -1), vm->host.sb.on ? "t" : "bt");
    if (st != LUA_OK) return load_error(L, &a->c, st, a->name);
    lua_call(L, 0, 0);
    return 0;
}

int ck_run_string(ck_vm *vm, const char *code, const char *chunkname)
{
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!code) return set_error(vm, CK_EARG, "ck_run_string: no code");
    runstring a = {{vm, 0}, code, chunkname ? chunkname : "string"};
    return protected(vm, p_run_string, &a.c, a.name);
}

/* ---- values, calls and globals */

/* pushes the value at a dotted path from the globals (nil when missing) */
static void push_path(lua_State *L, const char *name)
{
    lua_pushglobaltable(L);
    const char *p = name;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (!lua_istable(L, -1)) {
            lua_pop(L, 1);
            lua_pushnil(L);
            return;
        }
        lua_pushlstring(L, p, n);
        lua_gettable(L, -2);
        lua_remove(L, -2);
        if (!dot) return;
        p = dot + 1;
    }
}

static void push_value(lua_State *L, const ck_value *v)
{
    switch (v->type) {
    case CK_TBOOLEAN: lua_pushboolean(L, v->number != 0); break;
    case CK_TNUMBER:
        if (v->number == floor(v->number) && fabs(v->number) < 9007199254740992.0) lua_pushinteger(L, (lua_Integer)v->number);
        else lua_pushnumber(L, v->number);
        break;
    case CK_TSTRING:
        if (v->string) lua_pushlstring(L, v->string, v->len);
        else lua_pushnil(L);
        break;
    default: lua_pushnil(L); break;
    }
}

/* res from the value at index i; strings are kept alive by the results table
 * (at index keep) until the next call */
static void to_value(lua_State *L, int i, int keep, ck_value *res)
{
    i = lua_absindex(L, i);
    memset(res, 0, sizeof *res);
    switch (lua_type(L, i)) {
    case LUA_TNIL:
    case LUA_TNONE: res->type = CK_TNIL; break;
    case LUA_TBOOLEAN:
        res->type = CK_TBOOLEAN;
        res->number = lua_toboolean(L, i);
        break;
    case LUA_TNUMBER:
        res->type = CK_TNUMBER;
        res->number = lua_tonumber(L, i);
        break;
    case LUA_TSTRING:
        res->type = CK_TSTRING;
        lua_pushvalue(L, i);
        res->string = lua_tolstring(L, -1, &res->len);
        lua_rawseti(L, keep, (lua_Integer)luaL_len(L, keep) + 1);
        break;
    default:
        res->type = CK_TOTHER;
        res->string = luaL_typename(L, i);
        res->len = strlen(res->string);
        break;
    }
}

/* a fresh results table, in the registry and on the stack */
static int new_results(lua_State *L, ck_vm *vm)
{
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawseti(L, LUA_REGISTRYINDEX, vm->results_ref);
    return lua_gettop(L);
}

typedef struct callfn {
    call c;
    const char *name;
    int nargs;
    const ck_value *args;
    int nres;
    ck_value *res;
} callfn;

static int p_call(lua_State *L)
{
    callfn *a = lua_touserdata(L, 1);
    int keep = new_results(L, a->c.vm);
    push_path(L, a->name);
    if (!lua_isfunction(L, -1))
        return arg_error(L, &a->c, "ck_call: '%s' is not a function", a->name);
    luaL_checkstack(L, a->nargs + a->nres + 4, "too many arguments");
    for (int i = 0; i < a->nargs; i++) push_value(L, &a->args[i]);
    lua_call(L, a->nargs, a->nres);
    int first = lua_gettop(L) - a->nres + 1;
    for (int i = 0; i < a->nres; i++) to_value(L, first + i, keep, &a->res[i]);
    return 0;
}

int ck_call(ck_vm *vm, const char *name, int nargs, const ck_value *args, int nres, ck_value *res)
{
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!name || nargs < 0 || nres < 0 || (nargs && !args) || (nres && !res))
        return set_error(vm, CK_EARG, "ck_call: bad arguments");
    for (int i = 0; i < nres; i++) res[i] = ck_nil();
    callfn a = {{vm, 0}, name, nargs, args, nres, res};
    return protected(vm, p_call, &a.c, name);
}

typedef struct global {
    call c;
    const char *name;
    int type; /* LUA_TNUMBER or LUA_TSTRING */
    ck_value v;
    int set;
} global;

static int p_global(lua_State *L)
{
    global *a = lua_touserdata(L, 1);
    if (a->set) {
        const char *dot = strrchr(a->name, '.');
        if (dot) {
            lua_pushlstring(L, a->name, (size_t)(dot - a->name));
            push_path(L, lua_tostring(L, -1));
            if (!lua_istable(L, -1)) return arg_error(L, &a->c, "no table '%s' to set a field in", lua_tostring(L, -2));
        } else {
            lua_pushglobaltable(L);
        }
        push_value(L, &a->v);
        lua_setfield(L, -2, dot ? dot + 1 : a->name);
        return 0;
    }
    int keep = new_results(L, a->c.vm);
    push_path(L, a->name);
    if (lua_type(L, -1) != a->type)
        return luaL_error(L, "'%s' is %s, not a %s", a->name, luaL_typename(L, -1), lua_typename(L, a->type));
    to_value(L, -1, keep, &a->v);
    return 0;
}

static int get_global(ck_vm *vm, const char *name, int type, ck_value *v)
{
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!name) return set_error(vm, CK_EARG, "no name");
    global a = {{vm, CK_EARG}, name, type, {CK_TNIL, 0, NULL, 0}, 0};
    int st = protected(vm, p_global, &a.c, name);
    *v = a.v;
    return st;
}

int ck_get_number(ck_vm *vm, const char *name, double *out)
{
    ck_value v = ck_nil();
    int st = get_global(vm, name, LUA_TNUMBER, &v);
    if (st == CK_OK && out) *out = v.number;
    return st;
}

int ck_get_string(ck_vm *vm, const char *name, const char **out, size_t *len)
{
    ck_value v = ck_nil();
    int st = get_global(vm, name, LUA_TSTRING, &v);
    if (st == CK_OK) {
        if (out) *out = v.string;
        if (len) *len = v.len;
    }
    return st;
}

static int set_global(ck_vm *vm, const char *name, ck_value v)
{
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!name || !*name) return set_error(vm, CK_EARG, "no name");
    global a = {{vm, 0}, name, 0, v, 1};
    return protected(vm, p_global, &a.c, name);
}

int ck_set_number(ck_vm *vm, const char *name, double x) { return set_global(vm, name, ck_number(x)); }

int ck_set_string(ck_vm *vm, const char *name, const char *s)
{
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!s) return set_error(vm, CK_EARG, "ck_set_string: NULL string");
    return set_global(vm, name, ck_string(s));
}

/* ---- models */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct modelopen {
    call c;
    const char *name;
    int nargs;
    const ck_value *args;
    int ref;
} modelopen;

static int p_model_open(lua_State *L)
{
    modelopen *a = lua_touserdata(L, 1);
    push_path(L, a->name);
    if (lua_isfunction(L, -1)) {
        luaL_checkstack(L, a->nargs + 4, "too many arguments");
        for (int i = 0; i < a->nargs; i++) push_value(L, &a->args[i]);
        lua_call(L, a->nargs, 1);
    } else if (a->nargs > 0) {
        return arg_error(L, &a->c, "ck_model_open: '%s' is not a function, and only a function takes arguments", a->name);
    }
    if (!luaL_testudata(L, -1, "ck.program")) {
        a->c.code = CK_EARG;
        return luaL_error(L, "ck_model_open: '%s' %s %s, not a compiled program (g:compile{...})", a->name,
                          lua_isfunction(L, -1) ? "is" : "gave", luaL_typename(L, -1));
    }
    ck_lua_program(L, -1); /* raises if the program is closed */
    a->ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

static int p_unref(lua_State *L)
{
    luaL_unref(L, LUA_REGISTRYINDEX, (int)lua_tointeger(L, 1));
    return 0;
}

/* lets the program go (at ref in the registry) */
static void model_unref(ck_vm *vm, int ref)
{
    if (!vm->L) return;
    lua_pushcfunction(vm->L, p_unref);
    lua_pushinteger(vm->L, ref);
    if (lua_pcall(vm->L, 1, 0, 0) != LUA_OK) lua_pop(vm->L, 1);
}

int ck_model_open(ck_vm *vm, const char *name, int nargs, const ck_value *args, ck_model **out)
{
    if (out) *out = NULL;
    if (!vm) return CK_EARG;
    if (!live_vm(vm)) return CK_EINVAL;
    if (!name || !out || nargs < 0 || (nargs && !args)) return set_error(vm, CK_EARG, "ck_model_open: bad arguments");
    if (vm->dead) return vm->status;
    modelopen a = {{vm, 0}, name, nargs, args, LUA_NOREF};
    int st = protected(vm, p_model_open, &a.c, name);
    if (st != CK_OK) return st;
    pthread_mutex_lock(&reg_mu);
    ck_model *m = handle_new(sizeof *m);
    if (!m) {
        pthread_mutex_unlock(&reg_mu);
        model_unref(vm, a.ref);
        return set_error(vm, CK_EMEM, "out of memory");
    }
    m->vm = vm;
    m->ref = a.ref;
    m->loss = NAN;
    m->next = vm->models;
    if (vm->models) vm->models->prev = m;
    vm->models = m;
    pthread_mutex_unlock(&reg_mu);
    *out = m;
    return CK_OK;
}



void ck_model_close(ck_model *m)
{
    if (!live_model(m)) return; /* NULL, closed, or its VM closed */
    ck_vm *vm = m->vm;
    model_unref(vm, m->ref);
    pthread_mutex_lock(&reg_mu);
    if (m->prev) m->prev->next = m->next;
    else vm->models = m->next;
    if (m->next) m->next->prev = m->prev;
    handle_free(m, sizeof *m);
    pthread_mutex_unlock(&reg_mu);
}

typedef struct modelcall {
    call c;
    ck_model *m;
    const char *tensor;
    const float *in;
    float *outp;
    size_t n;
    double loss;
    ck_plan_info plan;
    ck_metrics metrics;
    int64_t *dims;
    int ndim;
    int64_t numel; /* read: the tensor's size once known, else -1 */
} modelcall;

static lua_Integer int_field(lua_State *L, int t, const char *k)
{
    lua_getfield(L, t, k);
    lua_Integer v = lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

/* the call's record at index 1; pushes m's program (index 2) */
static modelcall *model_args(lua_State *L)
{
    modelcall *a = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->m->ref);
    return a;
}

/* the program at index 2, the tensor name pushed at 3; returns its id */
static int model_tensor(lua_State *L, modelcall *a, ck_program **pp)
{
    *pp = ck_lua_program(L, 2);
    a->c.code = CK_EARG;
    lua_pushstring(L, a->tensor);
    int id = ck_lua_program_tensor(L, *pp, 3);
    a->c.code = 0;
    return id;
}

/* p:step() or p:forward() (method), its loss in a->loss; returns seconds taken */
static double model_run(lua_State *L, modelcall *a, const char *method)
{
    lua_getfield(L, 2, method);
    lua_pushvalue(L, 2);
    double t0 = now_s();
    lua_call(L, 1, 1);
    double dt = now_s() - t0;
    a->loss = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : NAN;
    a->m->loss = a->loss;
    return dt;
}

static int p_model_step(lua_State *L)
{
    modelcall *a = model_args(L);
    ck_model *m = a->m;
    double dt = model_run(L, a, "step");
    m->last_s = dt;
    m->total_s += dt;
    m->timed++;
    return 0;
}

static int p_model_forward(lua_State *L)
{
    model_run(L, model_args(L), "forward");
    return 0;
}

static int p_model_plan(lua_State *L)
{
    modelcall *a = model_args(L);
    lua_getfield(L, 2, "plan");
    lua_pushvalue(L, 2);
    lua_call(L, 1, 1);
    int t = lua_gettop(L);
    a->plan.peak = (size_t)int_field(L, t, "peak");
    a->plan.persistent = (size_t)int_field(L, t, "persistent");
    a->plan.transient = (size_t)int_field(L, t, "transient");
    a->plan.workspace = (size_t)int_field(L, t, "workspace");
    a->plan.arena = (size_t)int_field(L, t, "arena");
    a->plan.device = (size_t)int_field(L, t, "device_bytes");
    a->plan.ops = (int)int_field(L, t, "ops");
    return 0;
}

static int p_model_metrics(lua_State *L)
{
    modelcall *a = model_args(L);
    ck_model *m = a->m;
    ck_lua_program(L, 2);
    a->metrics.steps = (int64_t)int_field(L, 2, "steps");
    lua_getfield(L, 2, "lr");
    a->metrics.lr = lua_tonumber(L, -1);
    a->metrics.loss = m->loss;
    a->metrics.last_step_seconds = m->last_s;
    a->metrics.mean_step_seconds = m->timed ? m->total_s / (double)m->timed : 0;
    return 0;
}

static int p_model_shape(lua_State *L)
{
    modelcall *a = model_args(L);
    ck_program *p;
    int id = model_tensor(L, a, &p);
    const ck_tensor *t = &p->g->t[id];
    a->ndim = t->shape.ndim;
    for (int d = 0; d < t->shape.ndim && d < CK_SHAPE_MAX; d++) a->dims[d] = t->shape.d[d];
    return 0;
}

static int p_model_set(lua_State *L)
{
    modelcall *a = model_args(L);
    ck_program *p;
    int id = model_tensor(L, a, &p);
    const ck_tensor *t = &p->g->t[id];
    int64_t numel = ck_shape_numel(&t->shape);
    a->c.code = CK_EARG;
    if (p->poff[id] < 0) return luaL_error(L, "ck_model_set: '%s' is not an input or parameter", a->tensor);
    if (!ck_program_data(p, id)) return luaL_error(L, "ck_model_set: a plan-only program holds no values");
    if ((int64_t)a->n != numel) {
        char s[128];
        return luaL_error(L, "ck_model_set: '%s' %s has %d elements, got %d values", a->tensor,
                          ck_shape_str(&t->shape, s, sizeof s), (int)numel, (int)a->n);
    }
    float *x = ck_program_write_begin(p, id, 0);
    if (!x) return luaL_error(L, "ck_model_set: %s", p->err);
    memcpy(x, a->in, sizeof(float) * (size_t)numel);
    if (ck_program_write_end(p, id)) return luaL_error(L, "ck_model_set: %s", p->err);
    return 0;
}

static int p_model_read(lua_State *L)
{
    modelcall *a = model_args(L);
    ck_program *p;
    int id = model_tensor(L, a, &p);
    int64_t numel = ck_shape_numel(&p->g->t[id].shape);
    a->c.code = CK_EARG;
    const float *x = ck_program_read(p, id);
    if (!x && p->err[0]) return luaL_error(L, "ck_model_read: %s", p->err);
    if (!x)
        return luaL_error(L, "ck_model_read: '%s' was not kept by the last run; list it in compile{outputs=...}",
                          a->tensor);
    a->numel = numel;
    if (!a->outp) return 0;
    if (a->n < (size_t)numel)
        return luaL_error(L, "ck_model_read: '%s' has %d values, more than the buffer's %d", a->tensor, (int)numel,
                          (int)a->n);
    memcpy(a->outp, x, sizeof(float) * (size_t)numel);
    return 0;
}

/* runs f protected on m with the call's record a */
static int model_call(ck_model *m, lua_CFunction f, modelcall *a)
{
    if (!m) return CK_EARG;
    if (!live_model(m)) return CK_EINVAL;
    a->c.vm = m->vm;
    a->m = m;
    return protected(m->vm, f, &a->c, NULL);
}

/* the same for a call on one tensor, which must be named */
static int tensor_call(ck_model *m, lua_CFunction f, modelcall *a)
{
    if (m && !live_model(m)) return CK_EINVAL;
    if (m && !a->tensor) return set_error(m->vm, CK_EARG, "no tensor name");
    return model_call(m, f, a);
}

int ck_model_step(ck_model *m, double *loss)
{
    modelcall a = {0};
    int st = model_call(m, p_model_step, &a);
    if (loss) *loss = st == CK_OK ? a.loss : NAN;
    return st;
}

int ck_model_forward(ck_model *m, double *loss)
{
    modelcall a = {0};
    int st = model_call(m, p_model_forward, &a);
    if (loss) *loss = st == CK_OK ? a.loss : NAN;
    return st;
}

int ck_model_plan(ck_model *m, ck_plan_info *out)
{
    modelcall a = {0};
    if (m && !live_model(m)) return CK_EINVAL;
    if (!out) return m ? set_error(m->vm, CK_EARG, "ck_model_plan: NULL output") : CK_EARG;
    char msg[256];
    size_t n = known_size(out->size, PLAN_INFO_V1, "ck_plan_info", msg, sizeof msg);
    if (!n) return m ? set_error(m->vm, CK_EARG, msg) : CK_EARG;
    int st = model_call(m, p_model_plan, &a);
    a.plan.size = out->size;
    if (st == CK_OK) memcpy(out, &a.plan, n);
    return st;
}

int ck_model_metrics(ck_model *m, ck_metrics *out)
{
    modelcall a = {0};
    if (m && !live_model(m)) return CK_EINVAL;
    if (!out) return m ? set_error(m->vm, CK_EARG, "ck_model_metrics: NULL output") : CK_EARG;
    char msg[256];
    size_t n = known_size(out->size, METRICS_V1, "ck_metrics", msg, sizeof msg);
    if (!n) return m ? set_error(m->vm, CK_EARG, msg) : CK_EARG;
    int st = model_call(m, p_model_metrics, &a);
    a.metrics.size = out->size;
    if (st == CK_OK) memcpy(out, &a.metrics, n);
    return st;
}

int ck_model_set(ck_model *m, const char *tensor, const float *values, size_t n)
{
    modelcall a = {0};
    a.tensor = tensor;
    a.in = values;
    a.n = n;
    if (m && !live_model(m)) return CK_EINVAL;
    if (m && n && !values) return set_error(m->vm, CK_EARG, "ck_model_set: NULL values");
    return tensor_call(m, p_model_set, &a);
}

int ck_model_read(ck_model *m, const char *tensor, float *dst, size_t cap, size_t *numel)
{
    modelcall a = {0};
    a.tensor = tensor;
    a.outp = dst;
    a.n = cap;
    a.numel = -1;
    int st = tensor_call(m, p_model_read, &a);
    if (numel && a.numel >= 0) *numel = (size_t)a.numel;
    return st;
}

int ck_model_shape(ck_model *m, const char *tensor, int64_t dims[CK_SHAPE_MAX], int *ndim)
{
    int64_t tmp[CK_SHAPE_MAX];
    modelcall a = {0};
    a.tensor = tensor;
    a.dims = dims ? dims : tmp;
    int st = tensor_call(m, p_model_shape, &a);
    if (st == CK_OK && ndim) *ndim = a.ndim;
    return st;
}
