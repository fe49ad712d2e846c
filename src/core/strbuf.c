/* strbuf.c: the growing string of strbuf.h. */
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void dm_sb_printf(dm_sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && (size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *q = realloc(b->s, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q;
        b->cap = cap;
    }
}

void dm_sb_xml(dm_sbuf *b, const char *t) {
    for (; *t; t++) {
        switch (*t) {
        case '&': dm_sb_printf(b, "&amp;"); break;
        case '<': dm_sb_printf(b, "&lt;"); break;
        case '>': dm_sb_printf(b, "&gt;"); break;
        case '"': dm_sb_printf(b, "&quot;"); break;
        case '\'': dm_sb_printf(b, "&apos;"); break;
        default:
            if ((unsigned char)*t >= 0x20 || *t == '\n' || *t == '\t') dm_sb_printf(b, "%c", *t);
        }
    }
}

void dm_fmt_exact(char *buf, size_t n, double v) {
    if (!buf || !n) return;
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

char *dm_sb_done(dm_sbuf *b) {
    if (b->oom || !b->s) {
        free(b->s);
        b->s = NULL;
        return NULL;
    }
    return b->s;
}

void dm_sb_svg_open(dm_sbuf *b, int w, int h, int font_size) {
    dm_sb_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                 "font-family=\"sans-serif\"", w, h, w, h);
    if (font_size > 0) dm_sb_printf(b, " font-size=\"%d\"", font_size);
    dm_sb_printf(b, ">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", w, h);
}
