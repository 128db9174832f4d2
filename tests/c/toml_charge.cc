// What toml++ allocates while ck_toml_parse runs stays under what the scan
// charged for it beforehand (vm/formats/toml_scan.c's PER_KEY, PER_VALUE and
// PER_BYTE), on the shapes of text that make it allocate most per byte; and
// the charge is no more than a few times what it holds. Every operator new of
// the process is counted here (malloc's usable size and its header), so the
// peak is toml++'s tree plus the shim's small sorting vectors.
#include "formats/toml_scan.h"
#include "formats/toml_shim.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

static size_t live, peak;
static bool counting;

static void *counted(size_t n)
{
    void *p = std::malloc(n ? n : 1);
    if (!p) throw std::bad_alloc();
    if (counting) {
        live += malloc_usable_size(p) + 16;
        if (live > peak) peak = live;
    }
    return p;
}

static void uncounted(void *p)
{
    if (p && counting) live -= malloc_usable_size(p) + 16;
    std::free(p);
}

void *operator new(size_t n) { return counted(n); }
void *operator new[](size_t n) { return counted(n); }
void *operator new(size_t n, const std::nothrow_t &) noexcept
{
    try {
        return counted(n);
    } catch (...) {
        return nullptr;
    }
}
void *operator new[](size_t n, const std::nothrow_t &t) noexcept { return operator new(n, t); }
void operator delete(void *p) noexcept { uncounted(p); }
void operator delete[](void *p) noexcept { uncounted(p); }
void operator delete(void *p, size_t) noexcept { uncounted(p); }
void operator delete[](void *p, size_t) noexcept { uncounted(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { uncounted(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { uncounted(p); }

static size_t first_take;
static int take(void *, size_t n, const char *, char *, size_t)
{
    if (!first_take) first_take = n;
    return 0;
}
static void give(void *, size_t) {}

static int failed, passed;

// the text parsed; its tree's peak against the charge taken for it
static void shape(const char *what, const std::string &text, bool tight)
{
    ck_text_guard g = {take, give, nullptr, nullptr, nullptr};
    ck_toml_doc d;
    char err[512];
    first_take = 0;
    live = peak = 0;
    counting = true;
    const int rc = ck_toml_parse(text.data(), text.size(), &g, &d, err, sizeof err);
    counting = false;
    const bool under = rc == 0 && peak <= first_take, near = !tight || first_take <= 6 * peak;
    std::printf("%s %-44s %8zu bytes: toml++ peak %10zu, charged %10zu (%.2fx)%s%s\n", under && near ? "ok  " : "FAIL",
                what, text.size(), peak, first_take, peak ? (double)first_take / (double)peak : 0.0,
                rc ? ": " : "", rc ? err : "");
    (under && near ? passed : failed)++;
    if (rc == 0) ck_toml_doc_free(&g, &d);
}

static std::string times(const std::string &piece, size_t bytes)
{
    std::string s;
    while (s.size() + piece.size() <= bytes) s += piece;
    return s;
}

static std::string numbered(const char *fmt, size_t bytes)
{
    std::string s;
    char line[256];
    for (int i = 0; s.size() < bytes; i++) {
        std::snprintf(line, sizeof line, fmt, i, i, i);
        s += line;
    }
    return s;
}

int main()
{
    // 512 KiB of each shape; those that make tables, as much as the cap on tables allows
    const size_t B = 512 << 10;
    shape("an array of small integers", "x = [" + times("1,", B) + "1]\n", true);
    shape("an array of floats", "x = [" + times("1.5,", B) + "1]\n", true);
    shape("an array of empty strings", "x = [" + times("'',", B) + "1]\n", true);
    shape("an array of empty arrays", "x = [" + times("[],", B) + "1]\n", true);
    shape("an array of empty inline tables", "x = [" + times("{},", B) + "1]\n", true);
    shape("an array of dates", "x = [" + times("1979-05-27T07:32:00Z,", B) + "1]\n", true);
    shape("keys a line", numbered("k%d=1\n", B), true);
    shape("short keys a line", numbered("%x=1\n", B / 4), true);
    shape("tables by header", numbered("[t%d]\n", 60000), true);
    shape("arrays of tables by header", times("[[a]]\n", 54000), true);
    shape("dotted keys 6 parts deep", numbered("a%d.b.c.d.e.f=1\n", 32000), true);
    shape("dotted keys 30 parts deep", numbered("a%d.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.A.B.C.D=1\n", 22000), true);
    shape("headers of 16 keys", numbered("[a%d.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p]\n", 22000), true);
    shape("inline tables of many keys", "x = {" + numbered("k%d=1,", B) + "z=1}\n", true);
    shape("inline tables with dotted keys", "x = [" + times("{a.b.c=1},", 49000) + "{}]\n", true);
    shape("one long string", "x = '" + times("a", B) + "'\n", false);
    shape("a string of escapes", "x = \"" + times("\\u00e9", B) + "\"\n", false);
    shape("a multi-line string", "x = '''" + times("ab\n", B) + "'''\n", false);
    shape("many long strings", "x = [" + times("'" + std::string(200, 'a') + "',", B) + "1]\n", false);
    shape("arrays nested 30 deep, many times", "x = [" + times(std::string(29, '[') + std::string(29, ']') + ",", B) + "1]\n", true);
    shape("a small config", "[general]\nkeep_tokens = 1\n[[datasets]]\nresolution = 512\n", false);
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
