/* http_chunked.c - the chunked-body decoder in front of evhttp (see http_chunked.h).
 *
 * The framing rules mirror evhttp 2.1.12 (evhttp_get_body,
 * evhttp_get_body_length, evhttp_method_may_have_body): HEAD and TRACE have
 * no body; else "Transfer-Encoding: chunked" (the value compared without
 * case) frames the body as chunks; else a Content-Length (strtoll base 10,
 * the whole value, >= 0) gives its length; else there is none. Header values
 * are taken as evhttp takes them: leading spaces skipped, trailing spaces and
 * tabs trimmed; lines end in LF or CRLF.
 */
#include "http_chunked.h"

#include <event2/buffer.h>
#include <event2/util.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum cstate {
    C_FIRSTLINE, /* a request's first line */
    C_HEAD,      /* its header lines */
    C_BODY,      /* Content-Length body: `left` bytes to pass */
    C_SIZE,      /* a chunk-size line */
    C_DATA,      /* chunk data: `left` bytes to pass */
    C_DATA_END,  /* the CRLF after chunk data */
    C_TRAILER,   /* trailer lines after the last chunk */
    C_PASS,      /* cannot frame: every byte as is, for good */
    C_DEAD,      /* after a malformed chunk: input discarded */
};

typedef struct cframe {
    enum cstate st;
    int no_body;           /* HEAD / TRACE */
    int n_te, n_cl, chunked, cl_ok;
    int64_t cl, left;
    /* kept across requests: */
    unsigned seq;    /* chunked requests seen on the connection */
    unsigned err_seq; /* the one whose body was malformed (0 = none) */
    const char *err;
} cframe;

#define HEAD_LINE_MAX 65536 /* a longer head line: pass-through */
#define SIZE_LINE_MAX 4096  /* a longer chunk-size line: malformed */
#define PARSE_MAX 256       /* bytes of a head line looked at */

/* The next line's length without its end (LF or CRLF), and that end's
 * length; -1 when src has no complete line yet. */
static ssize_t next_line(struct evbuffer *src, size_t *eol_len)
{
    struct evbuffer_ptr p = evbuffer_search_eol(src, NULL, eol_len, EVBUFFER_EOL_CRLF);
    return p.pos;
}

static int name_is(const char *line, size_t name_len, const char *name)
{
    return name_len == strlen(name) && evutil_ascii_strncasecmp(line, name, name_len) == 0;
}

/* A header line of a head (C_HEAD) or a trailer: 0 = pass it, 1 = drop it
 * (HTTP_CHUNKED_HEADER from a client), -1 = cannot frame. */
static int header_line(cframe *f, struct evbuffer *src, size_t len, int trailer)
{
    char line[PARSE_MAX + 1];
    size_t n = len < PARSE_MAX ? len : PARSE_MAX;
    evbuffer_copyout(src, line, n);
    line[n] = '\0';
    if (line[0] == ' ' || line[0] == '\t') return -1; /* folded: obsolete, ambiguous */
    const char *colon = memchr(line, ':', n);
    if (!colon) return -1;
    size_t nlen = (size_t)(colon - line);
    if (name_is(line, nlen, HTTP_CHUNKED_HEADER)) return 1;
    if (trailer) return 0;
    int te = name_is(line, nlen, "Transfer-Encoding"), cl = name_is(line, nlen, "Content-Length");
    if (!te && !cl) return 0;
    if (len > PARSE_MAX) return -1;
    char *v = line + nlen + 1;
    v += strspn(v, " ");
    size_t vl = strlen(v);
    while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) v[--vl] = '\0';
    if (te) {
        f->n_te++;
        f->chunked = evutil_ascii_strcasecmp(v, "chunked") == 0;
    } else {
        char *end;
        f->n_cl++;
        f->cl = evutil_strtoll(v, &end, 10);
        f->cl_ok = *v && !*end && f->cl >= 0;
    }
    return 0;
}

/* The head is complete: where its body starts. */
static enum cstate body_state(cframe *f)
{
    if (f->no_body) return C_FIRSTLINE;
    if (f->n_te > 1 || f->n_cl > 1 || (f->n_te && !f->chunked)) return C_PASS;
    if (f->chunked) return C_SIZE;
    if (!f->n_cl) return C_FIRSTLINE;
    if (!f->cl_ok) return C_PASS; /* evhttp refuses it */
    f->left = f->cl;
    return f->left ? C_BODY : C_FIRSTLINE;
}

/* A chunk-size line (RFC 9112 7.1: 1*HEXDIG *(BWS ";" BWS ext-name [BWS "="
 * BWS ext-val])): its size, or -1 with *why. Extensions are checked for
 * control characters only: they carry nothing for this server. */
static int64_t chunk_size(const char *s, const char **why)
{
    size_t digits = strspn(s, "0123456789abcdefABCDEF");
    if (!digits) {
        *why = "malformed chunk size (expected hex digits)";
        return -1;
    }
    while (*s == '0' && digits > 1) s++, digits--;
    if (digits > 15) {
        *why = "chunk size out of range";
        return -1;
    }
    char hex[16];
    memcpy(hex, s, digits);
    hex[digits] = '\0';
    const char *p = s + digits;
    p += strspn(p, " \t");
    if (*p == ';') {
        const char *ext = p + 1 + strspn(p + 1, " \t");
        if (!*ext || *ext == ';' || *ext == '=') {
            *why = "malformed chunk extension (empty name)";
            return -1;
        }
        for (; *p; p++)
            if ((unsigned char)*p < 0x20 && *p != '\t') break;
    }
    if (*p) {
        *why = "malformed chunk size (unexpected characters after the size)";
        return -1;
    }
    return (int64_t)strtoll(hex, NULL, 16);
}

/* Ends the body early with the error trailer; the connection is done. */
static void malformed(cframe *f, struct evbuffer *src, struct evbuffer *dst, const char *why)
{
    evbuffer_add(dst, "0\r\n\r\n", 5);
    f->err_seq = f->seq;
    f->err = why;
    evbuffer_drain(src, evbuffer_get_length(src));
    f->st = C_DEAD;
}

/* A line-based state (first line, head, size, data end, trailer) with a
 * complete line of len bytes + eol in src: consumes it. */
static void on_line(cframe *f, struct evbuffer *src, struct evbuffer *dst, size_t len,
                    size_t eol)
{
    int drop = 0;
    switch (f->st) {
    case C_FIRSTLINE: {
        char m[8] = {0};
        evbuffer_copyout(src, m, len < 7 ? len : 7);
        if (len == 0) { /* evhttp refuses an empty first line */
            f->st = C_PASS;
            break;
        }
        cframe keep = *f; /* the connection's counters survive the reset */
        memset(f, 0, sizeof *f);
        f->seq = keep.seq;
        f->err_seq = keep.err_seq;
        f->err = keep.err;
        f->no_body = strncmp(m, "HEAD ", 5) == 0 || strncmp(m, "TRACE ", 6) == 0;
        f->st = C_HEAD;
        break;
    }
    case C_HEAD:
    case C_TRAILER:
        if (len == 0) {
            f->st = f->st == C_HEAD ? body_state(f) : C_FIRSTLINE;
            if (f->st == C_SIZE)
                evbuffer_add_printf(dst, "%s: %u\r\n", HTTP_CHUNKED_HEADER, ++f->seq);
            break;
        }
        drop = header_line(f, src, len, f->st == C_TRAILER);
        if (drop < 0) f->st = C_PASS;
        break;
    case C_SIZE: {
        char line[SIZE_LINE_MAX + 1];
        evbuffer_copyout(src, line, len);
        line[len] = '\0';
        const char *why = NULL;
        int64_t n = chunk_size(line, &why);
        if (n < 0) {
            malformed(f, src, dst, why);
            return;
        }
        evbuffer_drain(src, len + eol);
        evbuffer_add_printf(dst, "%llx\r\n", (unsigned long long)n);
        f->left = n;
        f->st = n ? C_DATA : C_TRAILER;
        return;
    }
    case C_DATA_END:
        if (len != 0) {
            malformed(f, src, dst, "chunk data longer than its chunk size");
            return;
        }
        f->st = C_SIZE;
        break;
    default:
        break;
    }
    if (drop)
        evbuffer_drain(src, len + eol);
    else
        evbuffer_remove_buffer(src, dst, len + eol);
}

/* One step: 1 when it consumed input, 0 when it needs more. */
static int step(cframe *f, struct evbuffer *src, struct evbuffer *dst)
{
    size_t have = evbuffer_get_length(src);
    if (!have) return 0;
    switch (f->st) {
    case C_PASS:
        evbuffer_remove_buffer(src, dst, have);
        return 1;
    case C_DEAD:
        evbuffer_drain(src, have);
        return 1;
    case C_BODY:
    case C_DATA: {
        size_t n = (uint64_t)f->left < have ? (size_t)f->left : have;
        evbuffer_remove_buffer(src, dst, n);
        f->left -= (int64_t)n;
        if (!f->left) f->st = f->st == C_BODY ? C_FIRSTLINE : C_DATA_END;
        return 1;
    }
    default:
        break;
    }
    size_t eol = 0;
    ssize_t len = next_line(src, &eol);
    size_t max = f->st == C_SIZE || f->st == C_DATA_END ? SIZE_LINE_MAX : HEAD_LINE_MAX;
    if (len < 0 || (size_t)len > max) {
        if (len < 0 && have <= max) return 0;
        if (f->st == C_SIZE || f->st == C_DATA_END)
            malformed(f, src, dst, f->st == C_SIZE ? "chunk size line too long"
                                                   : "chunk data longer than its chunk size");
        else
            f->st = C_PASS;
        return 1;
    }
    on_line(f, src, dst, (size_t)len, eol);
    return 1;
}

struct http_chunked {
    cframe f;
    struct evbuffer *in;      /* the bufferevent's input: what evhttp reads */
    struct evbuffer *raw;     /* read, not yet decoded (an incomplete line) */
    struct evbuffer *hold;    /* scratch */
    struct evbuffer_cb_entry *ent;
    int busy;                 /* on_input is moving bytes: its own calls are ignored */
};

/* The input buffer's callback: runs inside evbuffer_read, before the
 * bufferevent calls evhttp's read callback. The buffer then holds decoded
 * bytes evhttp has not consumed yet followed by the n_added bytes just read;
 * those move to raw and come back decoded. */
static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
    http_chunked *c = arg;
    if (c->busy || info->n_added == 0) return;
    c->busy = 1;
    size_t len = evbuffer_get_length(in);
    size_t fresh = info->n_added < len ? info->n_added : len;
    if (len > fresh) evbuffer_remove_buffer(in, c->hold, len - fresh);
    evbuffer_add_buffer(c->raw, in);
    if (evbuffer_get_length(c->hold)) evbuffer_add_buffer(in, c->hold);
    while (step(&c->f, c->raw, in)) {
    }
    c->busy = 0;
}

http_chunked *http_chunked_attach(struct bufferevent *bev)
{
    http_chunked *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->in = bufferevent_get_input(bev);
    c->raw = evbuffer_new();
    c->hold = evbuffer_new();
    c->ent = c->raw && c->hold ? evbuffer_add_cb(c->in, on_input, c) : NULL;
    if (!c->ent) {
        http_chunked_detach(c);
        return NULL;
    }
    return c;
}

const char *http_chunked_error(const http_chunked *c, const char *seq)
{
    char *end;
    unsigned long n = c && seq ? strtoul(seq, &end, 10) : 0;
    return n && !*end && n == c->f.err_seq ? c->f.err : NULL;
}

void http_chunked_detach(http_chunked *c)
{
    if (!c) return;
    if (c->ent) evbuffer_remove_cb_entry(c->in, c->ent);
    if (c->raw) evbuffer_free(c->raw);
    if (c->hold) evbuffer_free(c->hold);
    free(c);
}
