/* http_chunked.h - decodes chunked request bodies in front of evhttp into
 * the one form libevent 2.1.12 reads correctly.
 *
 * Why this exists: evhttp 2.1.12 (http.c, evhttp_handle_chunked_read) takes
 * a chunk-size line as hex digits followed by nothing or a space, so a chunk
 * extension (`5;name=value`, legal per RFC 9112 7.1.1) is refused, and it
 * reports every unreadable chunk (an extension, a malformed size) as "body
 * too long": 413. It has no hook between a request's headers and its body,
 * so the daemon cannot read a chunked body itself, and a bufferevent filter
 * under evhttp loses a reply on connections that close after it (the filter
 * reports its output written once handed to the socket bufferevent, evhttp
 * then frees both). So the bytes are rewritten where evhttp reads them: a
 * callback on the socket bufferevent's input buffer runs inside each read,
 * before evhttp's read callback, follows each request's framing as evhttp
 * frames it (Content-Length or chunked) and, in a chunked body, re-emits each
 * chunk as "<hex size>\r\n<data>\r\n", extensions dropped; trailer fields
 * pass as they are. To each chunked request's head it adds HTTP_CHUNKED_HEADER
 * with the request's number on the connection (and drops that field when a
 * client sends it). A malformed chunk (size not hex, out of range, a bad
 * extension, data longer than its size) ends the body there ("0\r\n\r\n"),
 * the rest of the connection's input is discarded, and http_chunked_error
 * names the fault for that request: the handler answers 400 and closes.
 * Anything it cannot frame for sure (several Content-Length or
 * Transfer-Encoding fields, a transfer coding other than chunked, folded
 * header lines, a head line over 64 KiB) makes it a plain pass-through for
 * the rest of the connection: evhttp then sees the client's bytes as they
 * are, as without it.
 *
 * Thread-safety: the event base's thread only (like the bufferevent).
 */
#ifndef IKBO_SERVER_HTTP_CHUNKED_H
#define IKBO_SERVER_HTTP_CHUNKED_H

#include <event2/bufferevent.h>
#include <event2/event.h>

#define HTTP_CHUNKED_HEADER "X-Ikbo-Chunked"

typedef struct http_chunked http_chunked;

/* Decodes the input of bev (a socket bufferevent made for evhttp, by
 * evhttp_set_bevcb) from now on. NULL on allocation failure (the bytes then
 * reach evhttp as they are). */
http_chunked *http_chunked_attach(struct bufferevent *bev);
/* The fault of the chunked request whose HTTP_CHUNKED_HEADER value is seq,
 * or NULL when its body was read whole (c NULL: NULL). */
const char *http_chunked_error(const http_chunked *c, const char *seq);
/* Stops decoding and frees c (NULL ok); bev must still exist. */
void http_chunked_detach(http_chunked *c);

#endif
