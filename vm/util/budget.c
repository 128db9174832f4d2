/* The memory budget of a VM (util/budget.h): charges counted against a limit
 * before the runtime allocates, with one reclaim tried before a refusal. */
#include "util/budget.h"

#include <stdint.h>
#include <stdio.h>

void ck_mem_text(size_t n, char *buf, size_t len)
{
    const double v = (double)n;
    if (n >= ((size_t)1 << 40)) snprintf(buf, len, "%.1f TiB", v / 1099511627776.0);
    else if (n >= ((size_t)1 << 30)) snprintf(buf, len, "%.1f GiB", v / 1073741824.0);
    else if (n >= ((size_t)1 << 20) && n % ((size_t)1 << 20) == 0) snprintf(buf, len, "%zu MiB", n >> 20);
    else if (n >= ((size_t)1 << 20)) snprintf(buf, len, "%.1f MiB", v / 1048576.0);
    else if (n >= 1024) snprintf(buf, len, "%.1f KiB", v / 1024.0);
    else snprintf(buf, len, "%zu bytes", n);
}

/* the total the VM would hold with n more bytes */
static size_t mem_total(const ck_mem_budget *b, size_t n)
{
    size_t t = b->used + (b->heap ? *b->heap : 0);
    return n > SIZE_MAX - t ? SIZE_MAX : t + n;
}

int ck_mem_take(ck_mem_budget *b, size_t n, const char *what, char *err, size_t errlen)
{
    if (!b) return 0;
    if (b->limit && mem_total(b, n) > b->limit && b->reclaim && !b->refusing) {
        b->refusing = 1;
        b->reclaim(b->reclaim_ud);
        b->refusing = 0;
    }
    if (b->limit && mem_total(b, n) > b->limit) {
        /* the flag's value that would have allowed it: the total rounded up
         * to a whole MiB (under 1 GiB) or GiB */
        const size_t need = mem_total(b, n), mib = (size_t)1 << 20, gib = (size_t)1 << 30;
        char lim[64], allow[64];
        ck_mem_text(b->limit, lim, sizeof lim);
        if (need == SIZE_MAX) snprintf(allow, sizeof allow, "none");
        else if (need < gib) snprintf(allow, sizeof allow, "%zuMiB", (need + mib - 1) / mib);
        else snprintf(allow, sizeof allow, "%zuGiB", need / gib + (need % gib != 0));
        snprintf(err, errlen, "%s would pass the memory limit of %s (--max-memory %s allows it)", what, lim, allow);
        b->refused = 1;
        return -1;
    }
    b->used += n;
    return 0;
}

void ck_mem_give(ck_mem_budget *b, size_t n)
{
    if (b) b->used = n > b->used ? 0 : b->used - n;
}

int ck_mem_hold(ck_mem_budget *b, size_t *held, size_t now, const char *what, char *err, size_t errlen)
{
    if (now <= *held) {
        ck_mem_give(b, *held - now);
        *held = now;
        return 0;
    }
    char w[200], size[64];
    ck_mem_text(now - *held, size, sizeof size);
    snprintf(w, sizeof w, "%s (%s)", what, size);
    if (ck_mem_take(b, now - *held, w, err, errlen)) return -1;
    *held = now;
    return 0;
}
