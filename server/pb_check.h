/* pb_check.h - what a request message's bytes must satisfy beyond what
 * protobuf-c checks when it unpacks them.
 *
 * Why this exists: protobuf-c 1.4 accepts three things protobuf says make a
 * message invalid or that this server cannot serve safely:
 * - a string field that is not valid UTF-8 (proto3 strings must be): it
 *   would be echoed into responses (request_id) that clients then fail to
 *   parse;
 * - a string field with an embedded NUL: protobuf-c hands it over as a C
 *   string, so `demo\0evil` would be served as model `demo`, while the
 *   HTTP/JSON transport refuses the same name;
 * - a field number above 2^29-1 (or a multi-byte encoded 0), kept as an
 *   unknown field.
 * Every request message the server reads is checked here, with an error
 * that names the field path (`users[2].sparse[0].name`). The fast
 * RankRequest decoder (rank_wire.h) and the JSON mapping (request.c) use the
 * same string check and message, so every transport and decoder gives the
 * same answer for the same content.
 *
 * Thread-safety: no state; every function is reentrant. Inputs are only
 * read.
 */
#ifndef IKBO_SERVER_PB_CHECK_H
#define IKBO_SERVER_PB_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "request.h"

#define PB_MAX_FIELD_NUMBER 536870911u /* 2^29 - 1, protobuf's largest */

/* ---- wire ------------------------------------------------------------- */

/* A varint of at most max_bytes bytes at *p (10 for a value; protobuf-c reads
 * a tag or a length prefix in at most 5): 0 with *p past it, or -1 (*p
 * unchanged). Bits past 64 drop, as in protobuf-c. The one reader of the
 * fast decoder (rank_wire.c) and the walker below. */
static inline int pb_read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v,
                                 int max_bytes)
{
    const uint8_t *q = *p;
    if (q < end && *q < 0x80) { /* the common one-byte case */
        *v = *q;
        *p = q + 1;
        return 0;
    }
    uint64_t x = 0;
    for (int i = 0; i < max_bytes && q < end; i++) {
        uint8_t b = *q++;
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *p = q;
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* ---- strings ---------------------------------------------------------- */

enum pb_str_fault { PB_STR_OK = 0, PB_STR_NUL, PB_STR_UTF8 };

/* The first fault of a string's bytes (enum pb_str_fault) and, when not OK,
 * its byte offset in *at. UTF-8 per the Unicode standard (Table 3-7): no
 * overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF,
 * no truncated sequence. */
int pb_str_check(const uint8_t *s, size_t n, size_t *at);

/* Sets *st to INVALID_ARGUMENT "<path>: string contains NUL at byte 4" or
 * "<path>: string is not valid UTF-8 at byte 4" (fault from pb_str_check)
 * and returns -1. The one wording for every transport. */
int pb_str_refuse(rq_status *st, const char *path, int fault, size_t at);

/* ---- field paths ------------------------------------------------------ */

#define PB_PATH_MAX 8

/* A field path as a decoder descends: names (static strings) and, for
 * repeated fields, element indices (-1 = not repeated). Cheap to keep up to
 * date (two stores a level); formatted only for an error. */
typedef struct pb_path {
    int depth;
    struct {
        const char *name;
        int64_t index;
    } at[PB_PATH_MAX];
} pb_path;

/* "users[2].sparse[0].name"; "request" for the empty path. */
void pb_path_format(const pb_path *p, char *out, size_t n);

/* ---- whole messages --------------------------------------------------- */

/* Walks the wire bytes of a message of type d (nested messages through
 * their descriptors): every tag's field number within 1..2^29-1, every
 * string field (singular or repeated, at any depth) through pb_str_check.
 * Returns 0, or -1 with *st INVALID_ARGUMENT naming the first fault in wire
 * order. Bytes protobuf-c refuses also fail here, with a generic message;
 * call it on bytes protobuf-c accepted. */
int pb_check_wire(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                  rq_status *st);

/* protobuf_c_message_unpack(d, al, len, buf), then pb_check_wire: the
 * message, or NULL with *st INVALID_ARGUMENT ("request is not a valid
 * ikbo.v1.RankRequest message", or the check's fault). al NULL = malloc;
 * free the message as protobuf-c's would be. */
ProtobufCMessage *pb_check_unpack(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *al,
                                  const uint8_t *buf, size_t len, rq_status *st);

#endif
