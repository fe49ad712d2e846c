/* strbuf.h: a growing string for the text dmove writes (SVG charts, tables, CSV): printf
 * into it, XML-escape into it, take the result. Running out of memory is remembered
 * (oom) and ends the building quietly; the caller checks once at the end. */
#ifndef DM_STRBUF_H
#define DM_STRBUF_H

#include <stddef.h>

#include "core/status.h"

typedef struct {
    char *s;      /* NUL-terminated once anything was written */
    size_t n;     /* length */
    size_t cap;
    int oom;      /* an allocation or format failed: the text is incomplete */
} dm_sbuf;

void dm_sb_printf(dm_sbuf *b, const char *fmt, ...) DM_PRINTF(2, 3);
/* t as XML text: & < > " ' escaped, control characters other than \n and \t dropped. */
void dm_sb_xml(dm_sbuf *b, const char *t);
/* The start of an SVG document w x h: the XML declaration, the <svg> element (sans-serif,
 * font_size if > 0) and a white background; the caller closes it with "</svg>". */
void dm_sb_svg_open(dm_sbuf *b, int w, int h, int font_size);
/* The string (the caller frees it), or NULL after a failure (the buffer is freed). */
char *dm_sb_done(dm_sbuf *b);
/* v as the shortest "%g" text that reads back as exactly v ("0.1", not
 * "0.10000000000000001"): exact, and readable in messages and file metadata. */
void dm_fmt_exact(char *buf, size_t n, double v);

#endif
