// libsentencepiece behind the C functions of vm/text/spm_shim.h: every call
// caught whole, so an exception (std::bad_alloc, darts-clone's) becomes a
// status and never unwinds into C.
#include "text/spm_shim.h"

#include <sentencepiece_processor.h>

#include <atomic>
#include <cstdio>
#include <new>
#include <string_view>
#include <vector>

struct ck_spmp {
    sentencepiece::SentencePieceProcessor sp;
    std::atomic<int> refs{1};
};

static void set_err(char *err, size_t errlen, const char *what)
{
    if (err && errlen) std::snprintf(err, errlen, "%s", what);
}

extern "C" ck_spmp *ck_spmp_load(const uint8_t *proto, size_t n, char *err, size_t errlen)
{
    ck_spmp *p = nullptr;
    try {
        p = new ck_spmp;
        const auto st = p->sp.LoadFromSerializedProto(std::string_view(reinterpret_cast<const char *>(proto), n));
        if (!st.ok()) {
            set_err(err, errlen, st.error_message());
            delete p;
            return nullptr;
        }
        return p;
    } catch (const std::exception &e) {
        set_err(err, errlen, e.what());
    } catch (...) {
        set_err(err, errlen, "libsentencepiece failed to load the model");
    }
    delete p;
    return nullptr;
}

extern "C" void ck_spmp_ref(ck_spmp *p) { p->refs.fetch_add(1); }

extern "C" void ck_spmp_unref(ck_spmp *p)
{
    if (p && p->refs.fetch_sub(1) == 1) delete p;
}

extern "C" int ck_spmp_encode(const ck_spmp *p, const char *text, size_t n,
                              int (*emit)(void *ud, const int *ids, size_t count), void *ud, char *err, size_t errlen)
{
    try {
        std::vector<int> ids;
        const auto st = p->sp.Encode(std::string_view(text, n), &ids);
        if (!st.ok()) {
            set_err(err, errlen, st.error_message());
            return -1;
        }
        return emit(ud, ids.data(), ids.size()) ? -2 : 0;
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, "libsentencepiece ran out of memory");
    } catch (const std::exception &e) {
        set_err(err, errlen, e.what());
    } catch (...) {
        set_err(err, errlen, "libsentencepiece failed");
    }
    return -1;
}
