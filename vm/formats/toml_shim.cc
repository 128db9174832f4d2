// toml++ behind the C functions of vm/formats/toml_shim.h. Compiled in
// header-only (the same code runs under the sanitizers and the fuzzer's
// coverage as in a release build, and nothing of it is needed at run time);
// every call is caught whole, so an exception never unwinds into C.
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#define TOML_ENABLE_FORMATTERS 0
// toml++ checks its parser's preconditions with TOML_ASSERT_ASSUME, which
// under NDEBUG becomes an assumption the optimizer builds on; 3.3.0 breaks
// one of them on some texts (a header whose first key is missing). So never
// NDEBUG here, and a broken check is thrown as a refusal, never an abort.
// The scan (vm/formats/toml_scan.c) refuses the texts known to do it first.
#undef NDEBUG
namespace ck_toml_check {
struct failed {
    const char *what;
};
} // namespace ck_toml_check
#define TOML_ASSERT(expr) ((expr) ? (void)0 : throw ck_toml_check::failed{#expr})
// in toml++'s noexcept helpers such a throw still ends the process, as the
// assert would have (the fuzz harness tests/fuzz/fuzz_toml.c looks for them)
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wexceptions"
#else
#pragma GCC diagnostic ignored "-Wterminate"
#endif
// The same for what it marks unreachable and what it tells the optimizer to
// assume: 3.3.0's whitespace table reaches its "unreachable" on most
// characters past ASCII where it looks for whitespace (the scan refuses such
// text: TOML allows them only in strings and comments).
#include <toml++/impl/preprocessor.h>
#undef TOML_UNREACHABLE
#define TOML_UNREACHABLE throw ck_toml_check::failed{"unreachable"}
#undef TOML_ASSUME
#define TOML_ASSUME(...) static_assert(true)
#include "formats/toml_shim.h"

#include "formats/toml_scan.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <new>
#include <streambuf>
#include <vector>

namespace {

// the text handed to toml++ a piece at a time, with a poll before each
// piece; a stop ends the text there (toml++ then fails or reads a prefix,
// and the caller throws either away)
constexpr size_t PIECE = 16 << 10;

class polled_text : public std::streambuf {
  public:
    polled_text(const char *s, size_t n, const ck_text_guard *g) : s_(const_cast<char *>(s)), n_(n), g_(g) {}
    bool stopped() const { return stopped_; }

  protected:
    int_type underflow() override
    {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        if (stopped_ || next_ >= n_) return traits_type::eof();
        if (g_ && g_->poll && g_->poll(g_->pud, (long long)since_)) {
            stopped_ = true;
            return traits_type::eof();
        }
        const size_t k = std::min(PIECE, n_ - next_);
        setg(s_ + next_, s_ + next_, s_ + next_ + k);
        next_ += k;
        since_ = k;
        return traits_type::to_int_type(*gptr());
    }

    // toml++ looks for a byte order mark, then seeks back to where it began
    pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override
    {
        const off_type here = (off_type)(next_ - (size_t)(egptr() - gptr()));
        const off_type to = dir == std::ios_base::beg ? off : dir == std::ios_base::cur ? here + off : (off_type)n_ + off;
        return seekpos(pos_type(to), std::ios_base::in);
    }

    pos_type seekpos(pos_type pos, std::ios_base::openmode) override
    {
        const off_type to = pos;
        if (to < 0 || (size_t)to > n_) return pos_type(off_type(-1));
        next_ = (size_t)to;
        setg(s_ + next_, s_ + next_, s_ + next_);
        return pos;
    }

  private:
    char *s_;
    size_t n_, next_ = 0, since_ = 0;
    const ck_text_guard *g_;
    bool stopped_ = false;
};

void fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

// the longest a date, a time or a date-time is as text
constexpr size_t DATE_TEXT = 48;

// what the flat list needs for node n and all it holds: items and text bytes
void measure(const toml::node &n, size_t &items, size_t &text)
{
    items++;
    if (const auto *t = n.as_table()) {
        for (auto &&[k, v] : *t) {
            text += k.str().size() + 1;
            measure(v, items, text);
        }
    } else if (const auto *a = n.as_array()) {
        for (const auto &v : *a) measure(v, items, text);
    } else if (const auto *s = n.as_string()) {
        text += s->get().size() + 1;
    } else if (n.is_date() || n.is_time() || n.is_date_time()) {
        text += DATE_TEXT;
    }
}

size_t time_text(char *p, size_t room, const toml::time &t)
{
    int k = std::snprintf(p, room, "%02u:%02u:%02u", (unsigned)t.hour, (unsigned)t.minute, (unsigned)t.second);
    if (t.nanosecond) {
        char frac[16];
        std::snprintf(frac, sizeof frac, ".%09u", (unsigned)t.nanosecond);
        size_t f = std::strlen(frac);
        while (f > 2 && frac[f - 1] == '0') f--;
        frac[f] = 0;
        k += std::snprintf(p + k, room - (size_t)k, "%s", frac);
    }
    return (size_t)k;
}

size_t date_text(char *p, size_t room, const toml::date &d)
{
    return (size_t)std::snprintf(p, room, "%04u-%02u-%02u", (unsigned)d.year, (unsigned)d.month, (unsigned)d.day);
}

struct filler {
    ck_toml_doc *doc;
    const ck_text_guard *g;
    size_t next = 0, used = 0, since = 0;
    bool stopped = false;

    filler(ck_toml_doc *d, const ck_text_guard *guard) : doc(d), g(guard) {}

    const char *put(const char *s, size_t n)
    {
        char *p = doc->text + used;
        if (n) std::memcpy(p, s, n);
        p[n] = 0;
        used += n + 1;
        return p;
    }

    void fill(const toml::node &n, const char *key, size_t klen, const toml::source_position &at)
    {
        if (stopped) return;
        if (++since >= 4096) {
            if (g && g->poll && g->poll(g->pud, (long long)since)) stopped = true;
            since = 0;
        }
        ck_toml_item &it = doc->items[next++];
        it.key = key;
        it.klen = klen;
        it.line = at.line;
        it.col = at.column;
        if (const auto *t = n.as_table()) {
            it.type = CK_TOML_TABLE;
            it.v.count = (uint32_t)t->size();
            // the entries in the order their keys first appear (toml++ keeps them sorted)
            std::vector<std::pair<const toml::key *, const toml::node *>> es;
            es.reserve(t->size());
            for (auto &&[k, v] : *t) es.emplace_back(&k, &v);
            std::stable_sort(es.begin(), es.end(), [](const auto &a, const auto &b) {
                const auto &x = a.first->source().begin, &y = b.first->source().begin;
                return x.line != y.line ? x.line < y.line : x.column < y.column;
            });
            for (const auto &[k, v] : es) {
                const char *kp = put(k->str().data(), k->str().size());
                fill(*v, kp, k->str().size(), k->source().begin);
            }
        } else if (const auto *a = n.as_array()) {
            it.type = CK_TOML_ARRAY;
            it.v.count = (uint32_t)a->size();
            for (const auto &v : *a) fill(v, nullptr, 0, v.source().begin);
        } else if (const auto *s = n.as_string()) {
            it.type = CK_TOML_STRING;
            it.str = put(s->get().data(), s->get().size());
            it.len = s->get().size();
        } else if (const auto *i = n.as_integer()) {
            it.type = CK_TOML_INTEGER;
            it.v.i = i->get();
        } else if (const auto *f = n.as_floating_point()) {
            it.type = CK_TOML_FLOAT;
            it.v.f = f->get();
        } else if (const auto *b = n.as_boolean()) {
            it.type = CK_TOML_BOOLEAN;
            it.v.b = b->get() ? 1 : 0;
        } else {
            char buf[DATE_TEXT];
            size_t k = 0;
            if (const auto *d = n.as_date()) {
                k = date_text(buf, sizeof buf, d->get());
            } else if (const auto *t = n.as_time()) {
                k = time_text(buf, sizeof buf, t->get());
            } else if (const auto *dt = n.as_date_time()) {
                const auto &v = dt->get();
                k = date_text(buf, sizeof buf, v.date);
                buf[k++] = 'T';
                k += time_text(buf + k, sizeof buf - k, v.time);
                if (v.offset) {
                    const int m = v.offset->minutes;
                    if (m == 0) k += (size_t)std::snprintf(buf + k, sizeof buf - k, "Z");
                    else k += (size_t)std::snprintf(buf + k, sizeof buf - k, "%c%02d:%02d", m < 0 ? '-' : '+', std::abs(m) / 60, std::abs(m) % 60);
                }
            }
            it.type = CK_TOML_DATE;
            it.str = put(buf, k);
            it.len = k;
        }
    }
};

// one line: a control character in toml++'s message (it quotes what it met) becomes a space
void one_line(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F) *s = ' ';
}

int parse(const char *s, size_t n, const ck_text_guard *g, ck_toml_doc *out, char *err, size_t errlen)
{
    ck_toml_scan sc;
    const int rc = ck_toml_scan_text(s, n, g ? g->poll : nullptr, g ? g->pud : nullptr, &sc, err, errlen);
    if (rc == -2) {
        fail(err, errlen, "%s", CK_TEXT_STOPPED);
        return CK_TOML_STOPPED;
    }
    if (rc) return CK_TOML_BAD;
    char what[96];
    std::snprintf(what, sizeof what, "toml++'s tree of the text's %zu values", sc.values);
    if (ck_text_take(g, sc.charge, what, err, errlen)) return CK_TOML_MEMORY;
    // given back once the tree is gone, however this returns
    struct charge {
        const ck_text_guard *g;
        size_t n;
        ~charge() { ck_text_give(g, n); }
    } held{g, sc.charge};
    int status = 0;
    {
        polled_text buf(s, n, g);
        std::istream in(&buf);
        toml::parse_result r = toml::parse(in);
        if (buf.stopped()) {
            status = CK_TOML_STOPPED;
        } else if (!r) {
            const auto &e = r.error();
            const auto d = e.description();
            fail(err, errlen, "line %u, column %u: %.*s", (unsigned)e.source().begin.line,
                 (unsigned)e.source().begin.column, (int)std::min(d.size(), (size_t)300), d.data());
            one_line(err);
            status = CK_TOML_BAD;
        } else {
            const toml::table &root = r.table();
            size_t items = 0, text = 0;
            measure(root, items, text);
            const size_t bytes = items * sizeof(ck_toml_item) + text + 1;
            char what2[96];
            std::snprintf(what2, sizeof what2, "the %zu values of the TOML text", items);
            if (ck_text_take(g, bytes, what2, err, errlen)) {
                status = CK_TOML_MEMORY;
            } else {
                out->charged = bytes;
                out->items = static_cast<ck_toml_item *>(std::calloc(items, sizeof(ck_toml_item)));
                out->text = static_cast<char *>(std::malloc(text + 1));
                if (!out->items || !out->text) {
                    fail(err, errlen, "out of memory for the %zu values of the TOML text", items);
                    status = CK_TOML_MEMORY;
                } else {
                    filler f(out, g);
                    f.fill(root, nullptr, 0, toml::source_position{1, 1});
                    if (f.stopped) status = CK_TOML_STOPPED;
                    out->n = items;
                    out->ntext = f.used;
                }
            }
        }
    } // the tree goes here, before its charge is given back
    if (status == CK_TOML_STOPPED) fail(err, errlen, "%s", CK_TEXT_STOPPED);
    return status;
}

} // namespace

extern "C" int ck_toml_parse(const char *s, size_t n, const ck_text_guard *g, ck_toml_doc *out, char *err, size_t errlen)
{
    std::memset(out, 0, sizeof *out);
    int rc;
    try {
        rc = parse(s, n, g, out, err, errlen);
    } catch (const ck_toml_check::failed &f) {
        fail(err, errlen, "toml++ cannot read this text (its check %s failed)", f.what);
        one_line(err);
        rc = CK_TOML_BAD;
    } catch (const std::bad_alloc &) {
        fail(err, errlen, "out of memory while toml++ read the text");
        rc = CK_TOML_MEMORY;
    } catch (const std::exception &e) {
        fail(err, errlen, "toml++ failed: %s", e.what());
        one_line(err);
        rc = CK_TOML_BAD;
    } catch (...) {
        fail(err, errlen, "toml++ failed");
        rc = CK_TOML_BAD;
    }
    if (rc) ck_toml_doc_free(g, out);
    return rc;
}

extern "C" void ck_toml_doc_free(const ck_text_guard *g, ck_toml_doc *d)
{
    std::free(d->items);
    std::free(d->text);
    ck_text_give(g, d->charged);
    std::memset(d, 0, sizeof *d);
}
