/* http.c - HTTP endpoints on libevent's evhttp (see http.h). */
#include "clock.h"
#include "http.h"

#include "../engine/serving.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <event2/util.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "http_chunked.h"
#include "log.h"
#include "request.h"

typedef struct http_rank http_rank;
typedef struct http_conn http_conn;

struct http_server {
    struct event_base *base;
    struct evhttp *http;
    struct event *stop_ev;   /* activated by http_stop: runs on_stop on the loop */
    struct event *cancel_ev; /* on_stop's timer: the ranks' drain time is over */
    int stop_wait_ms;        /* http_stop's drain time for ranks in flight */
    pthread_t thread;
    int started;
    int port;
    http_opts o;
    /* HTTP thread only: */
    http_conn *conns; /* open connections */
    http_rank *ranks; /* :rank calls between rank_submit and their reply */
    int stopping;     /* on_stop ran: the loop ends once ranks is empty and
                         every rank's reply was written (unsent == 0) */
    int unsent;       /* rank replies handed to evhttp, not yet written */
    int give_up;      /* the drain time is over: unsent replies are dropped */
};

/* ---- replies ------------------------------------------------------------ */

static void count_reply(http_server *h, const char *route, int status)
{
    char code[16];
    snprintf(code, sizeof code, "%d", status);
    const char *const labels[] = {route, code};
    metrics_add_l(h->o.metrics->http_requests_total, labels, 1);
}

static void reply(http_server *h, struct evhttp_request *req, const char *route, int status,
                  const char *content_type, const char *body, size_t len)
{
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    evhttp_add_header(out, "Content-Type", content_type);
    const char *reason = status == 200   ? "OK"
                         : status == 202 ? "Accepted"
                         : status == 400 ? "Bad Request"
                         : status == 403 ? "Forbidden"
                         : status == 404 ? "Not Found"
                         : status == 405 ? "Method Not Allowed"
                         : status == 429 ? "Too Many Requests"
                         : status == 501 ? "Not Implemented"
                         : status == 503 ? "Service Unavailable"
                         : status == 504 ? "Gateway Timeout"
                         : status == 499 ? "Client Closed Request"
                                         : "Internal Server Error";
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        /* evhttp adds Content-Length only to responses that carry a body
         * and would send a HEAD's body anyway: HEAD gets GET's headers,
         * Content-Length included, and no body (RFC 9110 9.3.2). */
        char cl[32];
        snprintf(cl, sizeof cl, "%zu", len);
        evhttp_add_header(out, "Content-Length", cl);
        evhttp_send_reply(req, status, reason, NULL);
    } else {
        struct evbuffer *b = evbuffer_new();
        if (b && body) evbuffer_add(b, body, len);
        evhttp_send_reply(req, status, reason, b);
        if (b) evbuffer_free(b);
    }
    count_reply(h, route, status);
}

static void reply_text(http_server *h, struct evhttp_request *req, const char *route,
                       int status, const char *text)
{
    reply(h, req, route, status, "text/plain; charset=utf-8", text, strlen(text));
}

static void reply_json(http_server *h, struct evhttp_request *req, const char *route,
                       int status, char *json /* freed here */)
{
    if (!json) {
        static const char oom[] = "{\"error\":{\"code\":\"INTERNAL\",\"message\":\"out of memory\"}}";
        reply(h, req, route, 500, "application/json", oom, sizeof oom - 1);
        return;
    }
    reply(h, req, route, status, "application/json", json, strlen(json));
    free(json);
}

static void reply_error(http_server *h, struct evhttp_request *req, const char *route,
                        int http_status, int code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void reply_error(http_server *h, struct evhttp_request *req, const char *route,
                        int http_status, int code, const char *fmt, ...)
{
    rq_status st;
    st.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st.msg, sizeof st.msg, fmt, ap);
    va_end(ap);
    reply_json(h, req, route, http_status, rq_error_json(&st));
}

/* ---- /v1/models --------------------------------------------------------- */

static json_t *strv(const char *const *s, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_string(s[i]));
    return a;
}

/* A float as the shortest decimal that reads back as the same float (0.285,
 * not 0.28499999642372131). */
static json_t *json_float(float f)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

/* A version's plan report (engine/plan.h's JSON). */
static json_t *plan_json(const ikbo_model *model)
{
    char *s = ikbo_model_plan(model, 1, REGISTRY_PLAN_RATIO);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    return o ? o : json_null();
}

static json_t *model_json(const registry_entry_view *e, const char *def_mode,
                          const char *def_device)
{
    json_t *m = json_object();
    if (!m) return NULL;
    json_object_set_new(m, "name", json_string(e->name));
    const ikbo_model_info *mi = NULL;
    for (int j = 0; j < e->n_versions && !mi; j++) mi = e->versions[j].info;
    if (mi) {
        json_t *user = json_pack("{s:i,s:o}", "dense", mi->user_dense, "sparse",
                                 strv(mi->user_sparse, mi->n_user_sparse));
        if (user && mi->has_history)
            json_object_set_new(user, "history",
                                json_pack("{s:i,s:i}", "max_len", mi->hist_max_len, "actions",
                                          mi->hist_actions));
        json_t *cand = json_pack("{s:i,s:o}", "dense", mi->cand_dense, "sparse",
                                 strv(mi->cand_sparse, mi->n_cand_sparse));
        json_object_set_new(m, "inputs", json_pack("{s:o,s:o}", "user", user, "candidate", cand));
        json_object_set_new(m, "tasks", strv(mi->tasks, mi->n_tasks));
        json_t *w = json_array();
        for (int t = 0; w && t < mi->n_tasks; t++)
            json_array_append_new(w, json_float(mi->score_weights[t]));
        json_object_set_new(m, "score_weights", w);
        json_object_set_new(m, "mode",
                            json_string(ikbo_mode_name(mi->mode)));
        json_object_set_new(m, "device", json_string(mi->device ? mi->device : def_device));
    } else {
        json_object_set_new(m, "mode", json_string(def_mode));
        json_object_set_new(m, "device", json_string(def_device));
    }
    json_t *vs = json_array();
    for (int j = 0; vs && j < e->n_versions; j++) {
        const registry_version_view *v = &e->versions[j];
        json_t *vo = json_pack("{s:I,s:s,s:s,s:f}", "version", (json_int_t)v->version, "state",
                               registry_state_name(v->state), "message", v->message,
                               "load_seconds", v->load_seconds);
        if (vo && v->serving) {
            /* The version's effective serving settings (registry.h: server
             * defaults < model.json "serving" < the model's config.json);
             * -1 = the server's batching config applies. */
            json_object_set_new(vo, "serving", serving_to_json(v->serving, SERVING_MODEL));
        }
        if (vo && v->model) json_object_set_new(vo, "plan", plan_json(v->model));
        json_array_append_new(vs, vo);
    }
    json_object_set_new(m, "versions", vs);
    if (e->unloaded) json_object_set_new(m, "unloaded", json_true());
    return m;
}

typedef struct models_ctx {
    json_t *models;
    const char *only; /* NULL = all */
    const char *def_mode, *def_device;
} models_ctx;

static void visit_model(const registry_entry_view *e, void *p)
{
    models_ctx *c = p;
    if (c->only && strcmp(c->only, e->name) != 0) return;
    json_array_append_new(c->models, model_json(e, c->def_mode, c->def_device));
}

static char *models_json(http_server *h, const char *only, int *found)
{
    models_ctx c = {.models = json_array(),
                    .only = only,
                    .def_mode = ikbo_mode_name(registry_mode(h->o.reg)),
                    .def_device = registry_device(h->o.reg)};
    if (!c.models) return NULL;
    registry_foreach(h->o.reg, visit_model, &c);
    *found = (int)json_array_size(c.models);
    json_t *root;
    if (only)
        root = *found ? json_incref(json_array_get(c.models, 0)) : json_object();
    else
        root = json_pack("{s:O}", "models", c.models);
    json_decref(c.models);
    if (!root) return NULL;
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(root);
    return s;
}

/* ---- handlers ----------------------------------------------------------- */

/* o as compact JSON (malloc'd; NULL when o is NULL); takes o. */
static char *dump_json(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

/* A loopback peer: 127.0.0.0/8, ::1 or ::ffff:127.x.x.x. */
static int peer_is_local(struct evhttp_request *req)
{
    struct evhttp_connection *c = evhttp_request_get_connection(req);
    const struct sockaddr *sa = c ? evhttp_connection_get_addr(c) : NULL;
    if (!sa) return 0;
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return 0;
}

/* Why an admin call must be refused as a possible cross-site request from a
 * browser (NULL = not refused). A loopback-only port is no defence against a
 * page in a browser on the same host: a form or fetch() there can POST to
 * 127.0.0.1. Browsers cannot send a custom header cross-origin without a
 * CORS preflight (OPTIONS, which gets 405 here, without CORS headers, so the
 * browser never sends the call), so the admin routes require one; and a
 * browser that says where the call comes from (Origin, Sec-Fetch-Site) is
 * refused unless it is this server's own origin. */
static const char *admin_cross_site(struct evhttp_request *req)
{
    const struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *mark = evhttp_find_header(in, "X-Ikbo-Admin");
    if (!mark || strcmp(mark, "1") != 0)
        return "admin calls need the header 'X-Ikbo-Admin: 1' (a browser cannot send it "
               "cross-site)";
    const char *site = evhttp_find_header(in, "Sec-Fetch-Site");
    if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
        return "admin calls from a browser page of another origin are refused "
               "(Sec-Fetch-Site is not same-origin)";
    const char *origin = evhttp_find_header(in, "Origin");
    if (origin) {
        const char *host = evhttp_find_header(in, "Host");
        static const char scheme[] = "http://";
        size_t n = sizeof scheme - 1;
        if (!host || evutil_ascii_strncasecmp(origin, scheme, n) != 0 ||
            evutil_ascii_strcasecmp(origin + n, host) != 0)
            return "admin calls from a browser page of another origin are refused (Origin "
                   "is not this server)";
    }
    return NULL;
}

/* POST /v1/models/{name}/load|unload[?version=N]: admin, loopback only
 * unless admin_http says otherwise, never cross-site (admin_cross_site). */
static void handle_admin(http_server *h, struct evhttp_request *req, const char *route,
                         const char *name, int load)
{
    const char *why = h->o.admin == HTTP_ADMIN_OFF ? "admin endpoints are off (admin_http: off)"
                      : h->o.admin == HTTP_ADMIN_LOCAL && !peer_is_local(req)
                          ? "admin endpoints answer loopback clients only (admin_http: local)"
                          : admin_cross_site(req);
    if (why) {
        reply_json(h, req, route, 403,
                   dump_json(json_pack("{s:{s:s,s:s}}", "error", "code", "PERMISSION_DENIED",
                                       "message", why)));
        return;
    }
    int64_t version = 0;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *query = uri ? evhttp_uri_get_query(uri) : NULL;
    if (query && *query) {
        struct evkeyvalq q;
        q.tqh_first = NULL;
        q.tqh_last = &q.tqh_first;
        const char *bad = NULL;
        if (evhttp_parse_query_str(query, &q) != 0) {
            bad = "query: cannot parse";
        } else {
            for (struct evkeyval *kv = q.tqh_first; kv && !bad; kv = kv->next.tqe_next) {
                char *end;
                if (strcmp(kv->key, "version") != 0) {
                    bad = "query: unknown parameter (known: version)";
                } else {
                    long long x = strtoll(kv->value, &end, 10);
                    if (end == kv->value || *end || x < 1)
                        bad = "version: expected a positive integer";
                    version = x;
                }
            }
        }
        evhttp_clear_headers(&q);
        if (bad) {
            reply_error(h, req, route, 400, RQ_INVALID_ARGUMENT, "%s", bad);
            return;
        }
    }
    rq_status st;
    rq_status_ok(&st);
    int rc = load ? registry_admin_load(h->o.reg, name, version, &st)
                  : registry_admin_unload(h->o.reg, name, version, &st);
    if (rc != 0) {
        reply_json(h, req, route, rq_code_http(st.code), rq_error_json(&st));
        return;
    }
    if (load) {
        /* Loading runs on the registry's worker: poll GET /v1/models/{name}. */
        reply_json(h, req, route, 202,
                   dump_json(json_pack("{s:s,s:I,s:s}", "model", name, "version",
                                       (json_int_t)version, "status", "load requested")));
    } else {
        int found = 0;
        reply_json(h, req, route, 200, models_json(h, name, &found));
    }
}

/* ---- connections ---------------------------------------------------------
 *
 * Every connection gets a bufferevent made here (evhttp_set_bevcb) and a
 * record: its chunked-body decoder (http_chunked.h) and the :rank in flight
 * on it, if any. The record is freed by evhttp's close callback (conn_gone),
 * set as soon as the connection exists (conn_attach: evhttp makes it after
 * the bufferevent, so attaching runs from an event activated in new_bev;
 * until then a reference on the bufferevent keeps it, and its input, valid
 * even when evhttp frees the connection first). */
struct http_conn {
    http_server *h;
    struct bufferevent *bev;
    struct evhttp_connection *evcon; /* set by conn_attach */
    struct event *attach_ev;         /* NULL once attached */
    http_chunked *chunked;
    http_rank *rank; /* the request in flight on it (evhttp handles one at a time) */
    int reply_unsent; /* its rank reply is counted in h->unsent */
    http_conn *prev, *next;
};

/* Once stopping, the loop ends when no rank is in flight and every rank
 * reply has reached the socket (evhttp_free would drop unsent bytes). */
static void stop_when_done(http_server *h)
{
    if (h->stopping && !h->ranks && (!h->unsent || h->give_up)) event_base_loopbreak(h->base);
}

static void reply_written(http_conn *c)
{
    if (!c->reply_unsent) return;
    c->reply_unsent = 0;
    c->h->unsent--;
    stop_when_done(c->h);
}

/* evhttp's on_complete: the reply was written whole. */
static void rank_reply_sent(struct evhttp_request *req, void *arg)
{
    (void)req;
    reply_written(arg);
}

static void rank_conn_gone(http_rank *r, struct evhttp_connection *evcon);

static void conn_free(http_conn *c)
{
    http_server *h = c->h;
    reply_written(c); /* the connection is gone: nothing left to write */
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    http_chunked_detach(c->chunked);
    free(c);
}

static void conn_gone(struct evhttp_connection *evcon, void *arg)
{
    http_conn *c = arg;
    if (c->rank) rank_conn_gone(c->rank, evcon);
    conn_free(c);
}

/* Drops new_bev's reference; frees c when evhttp has already dropped the
 * connection (its callbacks are cleared by bufferevent_free). Returns 0 when
 * c is attached, -1 when it was freed. */
static int conn_attach(http_conn *c)
{
    if (!c->attach_ev) return 0;
    event_free(c->attach_ev);
    c->attach_ev = NULL;
    struct bufferevent *bev = c->bev;
    bufferevent_data_cb readcb = NULL;
    void *evcon = NULL;
    bufferevent_getcb(bev, &readcb, NULL, NULL, &evcon);
    int rc = 0;
    if (readcb && evcon) {
        c->evcon = evcon;
        evhttp_connection_set_closecb(c->evcon, conn_gone, c);
    } else {
        conn_free(c);
        rc = -1;
    }
    bufferevent_decref(bev);
    return rc;
}

static void on_attach(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)conn_attach(arg);
}

static struct bufferevent *new_bev(struct event_base *base, void *arg)
{
    http_server *h = arg;
    http_conn *c = calloc(1, sizeof *c);
    struct bufferevent *bev = c ? bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE) : NULL;
    if (bev) c->attach_ev = event_new(base, -1, 0, on_attach, c);
    if (!c || !bev || !c->attach_ev) {
        if (bev) bufferevent_free(bev);
        free(c);
        return NULL; /* evhttp makes its own: no decoder */
    }
    c->h = h;
    c->bev = bev;
    c->chunked = http_chunked_attach(bev); /* NULL: no decoder, bytes as they are */
    bufferevent_incref(bev);
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    event_active(c->attach_ev, EV_TIMEOUT, 1);
    return bev;
}

/* The record of req's connection (attached), or NULL. */
static http_conn *conn_of(http_server *h, struct evhttp_request *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    for (http_conn *c = h->conns; c && bev; c = c->next) {
        if (c->bev != bev) continue;
        return conn_attach(c) == 0 && c->evcon == evcon ? c : NULL;
    }
    return NULL;
}

/* ---- asynchronous :rank --------------------------------------------------
 *
 * evhttp is single-threaded, so the HTTP thread must never wait for compute:
 * a :rank is handed to rank_submit and the thread goes back to its loop
 * (probes and /metrics keep answering). rank_submit's callback runs on a
 * batcher thread (or here, for an early error); it only stores the answer
 * and activates the call's done_ev, an event on the HTTP base (the base is
 * made with evthread locking, so event_active is safe from any thread), and
 * rank_deliver sends the reply on the HTTP thread.
 *
 * While a request is being handled evhttp reads nothing from its connection
 * (read is disabled until the reply), so the connection stays alive unless
 * evhttp frees it (evhttp_free, or a network error). Its close callback
 * (conn_gone -> rank_conn_gone) tells us: then the request has either been
 * freed with the connection (req dropped here) or detached from it (kept:
 * evhttp frees a detached request on evhttp_send_reply). peer_ev watches
 * the socket for the client closing it mid-compute (EOF) and sets
 * cancelled, so a rank still queued is not computed (one-shot: a pipelined
 * request ends the watch). http_stop cancels every call and waits for their
 * callbacks before it frees the base (on_stop, rank_deliver). */
struct http_rank {
    http_server *h;
    struct evhttp_request *req;      /* NULL once evhttp freed it */
    http_conn *conn;                 /* NULL once the connection is gone */
    struct event *done_ev;           /* rank_done -> rank_deliver */
    struct event *peer_ev;           /* the socket is readable: peer_readable */
    Ikbo__V1__RankRequest *rr;
    atomic_int cancelled; /* rank.h: a queued rank is dropped once set */
    /* written by rank_done before event_active, read by rank_deliver: */
    Ikbo__V1__RankResponse *resp;
    rq_status st;
    http_rank *prev, *next; /* h->ranks */
};

static const char rank_route[] = "/v1/models/{name}:rank";

static void peer_watch_stop(http_rank *r)
{
    if (r->peer_ev) event_free(r->peer_ev);
    r->peer_ev = NULL;
}

/* The client's socket became readable while its rank computes: EOF (or an
 * error) means the client is gone; bytes mean a pipelined request, read by
 * evhttp after the reply. One-shot: the watcher is not re-armed after. */
static void peer_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    http_rank *r = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        event_add(r->peer_ev, NULL);
        return;
    }
    if (n <= 0) atomic_store(&r->cancelled, 1);
}

/* evhttp frees the connection of a rank in flight (conn_gone). */
static void rank_conn_gone(http_rank *r, struct evhttp_connection *evcon)
{
    peer_watch_stop(r); /* its fd is about to close */
    atomic_store(&r->cancelled, 1);
    /* Still on the connection's list: freed with it, right after this. */
    if (r->req && evhttp_request_get_connection(r->req) == evcon) r->req = NULL;
    r->conn = NULL;
}

/* rank_submit's callback: any thread. */
static void rank_done(void *arg, Ikbo__V1__RankResponse *resp, const rq_status *st)
{
    http_rank *r = arg;
    r->resp = resp;
    r->st = *st;
    event_active(r->done_ev, EV_TIMEOUT, 1);
}

/* The rank's answer, on the HTTP thread: reply, unlink, free. */
static void rank_deliver(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    http_rank *r = arg;
    http_server *h = r->h;
    peer_watch_stop(r);
    if (r->conn) r->conn->rank = NULL;
    int status = r->resp ? 200 : rq_code_http(r->st.code);
    if (r->req && r->conn) {
        r->conn->reply_unsent = 1;
        h->unsent++;
        evhttp_request_set_on_complete_cb(r->req, rank_reply_sent, r->conn);
    }
    if (r->req)
        reply_json(h, r->req, rank_route, status,
                   r->resp ? rq_response_to_json(r->resp) : rq_error_json(&r->st));
    else
        count_reply(h, rank_route, status); /* nobody to answer */
    if (r->prev)
        r->prev->next = r->next;
    else
        h->ranks = r->next;
    if (r->next) r->next->prev = r->prev;
    rq_response_free(r->resp);
    rq_request_free(r->rr);
    event_free(r->done_ev);
    free(r);
    stop_when_done(h);
}

/* Submits rr (taken) for req; the reply comes from rank_deliver. */
static void rank_start(http_server *h, struct evhttp_request *req, Ikbo__V1__RankRequest *rr,
                       int64_t deadline)
{
    http_rank *r = calloc(1, sizeof *r);
    http_conn *conn = conn_of(h, req);
    if (r) r->done_ev = event_new(h->base, -1, 0, rank_deliver, r);
    if (!r || !r->done_ev || !conn) {
        if (r && r->done_ev) event_free(r->done_ev);
        free(r);
        rq_request_free(rr);
        const char *const mc[] = {"", "INTERNAL"};
        metrics_add_l(h->o.metrics->requests_total, mc, 1);
        reply_error(h, req, rank_route, 500, RQ_INTERNAL, "out of memory");
        return;
    }
    r->h = h;
    r->req = req;
    r->conn = conn;
    conn->rank = r;
    r->rr = rr;
    atomic_init(&r->cancelled, 0);
    evutil_socket_t fd = bufferevent_getfd(conn->bev);
    if (fd >= 0) r->peer_ev = event_new(h->base, fd, EV_READ, peer_readable, r);
    if (r->peer_ev && event_add(r->peer_ev, NULL) != 0) peer_watch_stop(r);
    r->next = h->ranks;
    if (h->ranks) h->ranks->prev = r;
    h->ranks = r;
    rank_submit(h->o.rank, rr, deadline, &r->cancelled, "http", rank_done, r);
}

static void handle_rank(http_server *h, struct evhttp_request *req, const char *route,
                        const char *name)
{
    if (atomic_load(h->o.draining) || h->stopping) {
        const char *const mc[] = {"", "UNAVAILABLE"};
        metrics_add_l(h->o.metrics->requests_total, mc, 1);
        reply_error(h, req, route, 503, RQ_UNAVAILABLE, "server is shutting down");
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    rq_status st;
    rq_status_ok(&st);
    Ikbo__V1__RankRequest *rr = rq_request_from_json(body, len, &st);
    if (rr && rr->model && rr->model[0] && strcmp(rr->model, name) != 0) {
        char body_name[100], path_name[100];
        snprintf(body_name, sizeof body_name, "%.80s", rr->model);
        snprintf(path_name, sizeof path_name, "%.80s", name);
        rq_status_set(&st, RQ_INVALID_ARGUMENT,
                      "model: the body names '%s' but the path names '%s'", body_name,
                      path_name);
        rq_request_free(rr);
        rr = NULL;
    }
    if (rr && (!rr->model || !rr->model[0])) {
        char *dup = strdup(name);
        if (!dup) {
            rq_status_set(&st, RQ_INTERNAL, "out of memory");
            rq_request_free(rr);
            rr = NULL;
        } else {
            if (rr->model && rr->model != protobuf_c_empty_string) free(rr->model);
            rr->model = dup;
        }
    }
    if (!rr) {
        const char *const mc[] = {"", rq_code_name(st.code)};
        metrics_add_l(h->o.metrics->requests_total, mc, 1);
        reply_json(h, req, route, rq_code_http(st.code), rq_error_json(&st));
        return;
    }
    /* An optional deadline, like gRPC's: X-Request-Timeout-Ms: <ms from now>. */
    int64_t deadline = 0;
    const char *tmo = evhttp_find_header(evhttp_request_get_input_headers(req),
                                         "X-Request-Timeout-Ms");
    if (tmo) {
        char *end;
        long long ms = strtoll(tmo, &end, 10);
        if (end == tmo || *end || ms < 0) {
            rq_request_free(rr);
            const char *const mc[] = {"", "INVALID_ARGUMENT"};
            metrics_add_l(h->o.metrics->requests_total, mc, 1);
            reply_error(h, req, route, 400, RQ_INVALID_ARGUMENT,
                        "X-Request-Timeout-Ms: expected milliseconds >= 0, got '%.40s'", tmo);
            return;
        }
        deadline = clock_mono_ns() + (ms > 86400000LL ? 86400000LL : ms) * 1000000LL;
    }
    rank_start(h, req, rr, deadline);
}

static void handle(struct evhttp_request *req, void *arg)
{
    http_server *h = arg;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *raw = uri ? evhttp_uri_get_path(uri) : NULL;
    size_t path_len = 0;
    char *path = evhttp_uridecode(raw && *raw ? raw : "/", 0, &path_len);
    if (!path) {
        reply_error(h, req, "other", 500, RQ_INTERNAL, "out of memory");
        return;
    }
    if (strlen(path) != path_len) { /* "%00": the C string would end early */
        free(path);
        reply_error(h, req, "other", 400, RQ_INVALID_ARGUMENT, "path: contains NUL (%%00)");
        return;
    }
    /* A chunked body the decoder could not read (http_chunked.h); it has
     * dropped the rest of the connection's input. */
    const char *seq = evhttp_find_header(evhttp_request_get_input_headers(req),
                                         HTTP_CHUNKED_HEADER);
    http_conn *conn = seq ? conn_of(h, req) : NULL;
    const char *chunk_err = conn ? http_chunked_error(conn->chunked, seq) : NULL;
    if (chunk_err) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        reply_error(h, req, "other", 400, RQ_INVALID_ARGUMENT, "request body: %s", chunk_err);
        free(path);
        return;
    }
    int get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD;
    int post = cmd == EVHTTP_REQ_POST;
    static const char prefix[] = "/v1/models/";
    size_t plen = strlen(prefix);
    const char *route = "other";

    if (strcmp(path, "/metrics") == 0) {
        route = "/metrics";
        if (!get) goto not_allowed;
        size_t len = 0;
        char *text = metrics_render(h->o.metrics->reg, &len);
        if (!text) {
            reply_error(h, req, route, 500, RQ_INTERNAL, "out of memory");
        } else {
            reply(h, req, route, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
            free(text);
        }
    } else if (strcmp(path, "/healthz") == 0) {
        route = "/healthz";
        if (!get) goto not_allowed;
        reply_text(h, req, route, 200, "ok\n");
    } else if (strcmp(path, "/readyz") == 0) {
        route = "/readyz";
        if (!get) goto not_allowed;
        char why[600];
        if (atomic_load(h->o.draining)) {
            reply_text(h, req, route, 503, "not ready: draining (shutting down)\n");
        } else if (registry_all_ready(h->o.reg, why, sizeof why - 16)) {
            reply_text(h, req, route, 200, "ready\n");
        } else {
            char text[640];
            snprintf(text, sizeof text, "not ready: %s\n", why);
            reply_text(h, req, route, 503, text);
        }
    } else if (strcmp(path, "/v1/models") == 0 || strcmp(path, "/v1/models/") == 0) {
        route = "/v1/models";
        if (!get) goto not_allowed;
        int found;
        reply_json(h, req, route, 200, models_json(h, NULL, &found));
    } else if (strncmp(path, prefix, plen) == 0 && path[plen]) {
        const char *name = path + plen;
        size_t nlen = strlen(name);
        static const char rank_suffix[] = ":rank";
        size_t slen = sizeof rank_suffix - 1;
        static const char load_suffix[] = "/load", unload_suffix[] = "/unload";
        size_t llen = sizeof load_suffix - 1, ulen = sizeof unload_suffix - 1;
        int is_load = nlen > llen && strcmp(name + nlen - llen, load_suffix) == 0;
        int is_unload = nlen > ulen && strcmp(name + nlen - ulen, unload_suffix) == 0;
        if (is_load || is_unload) {
            route = is_load ? "/v1/models/{name}/load" : "/v1/models/{name}/unload";
            if (!post) goto not_allowed;
            const size_t base = nlen - (is_load ? llen : ulen); /* the name's length */
            if (memchr(name, '/', base) || memchr(name, ':', base)) {
                reply_error(h, req, route, 404, RQ_NOT_FOUND, "no route for %.200s", path);
            } else {
                path[plen + base] = '\0';
                handle_admin(h, req, route, name, is_load);
            }
        } else if (nlen > slen && strcmp(name + nlen - slen, rank_suffix) == 0) {
            route = "/v1/models/{name}:rank";
            if (!post) goto not_allowed;
            path[plen + nlen - slen] = '\0';
            handle_rank(h, req, route, name);
        } else if (!strchr(name, '/') && !strchr(name, ':')) {
            route = "/v1/models/{name}";
            if (!get) goto not_allowed;
            int found = 0;
            char *json = models_json(h, name, &found);
            if (json && !found) {
                free(json);
                reply_error(h, req, route, 404, RQ_NOT_FOUND, "model '%.100s' not found", name);
            } else {
                reply_json(h, req, route, 200, json);
            }
        } else {
            reply_error(h, req, route, 404, RQ_NOT_FOUND, "no route for %.200s", path);
        }
    } else {
        reply_error(h, req, route, 404, RQ_NOT_FOUND, "no route for %.200s", path);
    }
    free(path);
    return;

not_allowed:
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                      strncmp(route, "/v1/models/{name}", 17) == 0 && route[17] ? "POST" : "GET, HEAD");
    reply_error(h, req, route, 405, RQ_UNIMPLEMENTED, "method not allowed on %.200s", path);
    free(path);
}

/* ---- lifecycle ---------------------------------------------------------- */

/* The drain time is over: ranks still queued are dropped (their callbacks
 * still come, as CANCELLED), and replies a client does not read are not
 * waited for. */
static void on_cancel(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    http_server *h = arg;
    for (http_rank *r = h->ranks; r; r = r->next) atomic_store(&r->cancelled, 1);
    h->give_up = 1;
    stop_when_done(h);
}

/* New ranks are refused from now on; the loop ends once every rank in
 * flight was answered and its reply written, for which they have
 * stop_wait_ms. */
static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    http_server *h = arg;
    h->stopping = 1;
    if (!h->ranks && !h->unsent) {
        stop_when_done(h);
    } else if (h->stop_wait_ms > 0) {
        struct timeval tv = {h->stop_wait_ms / 1000, (h->stop_wait_ms % 1000) * 1000};
        evtimer_add(h->cancel_ev, &tv);
    } else {
        on_cancel(-1, 0, h);
    }
}

static void *http_main(void *arg)
{
    http_server *h = arg;
    log_thread_name("ikbo-http", -1);
    event_base_dispatch(h->base);
    return NULL;
}

/* "host:port" / "[v6]:port" -> host, port. */
static int split_listen(const char *listen, char *host, size_t hn, int *port)
{
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen) return -1;
    size_t n = (size_t)(colon - listen);
    const char *h0 = listen;
    if (listen[0] == '[' && colon[-1] == ']') {
        h0 = listen + 1;
        n -= 2;
    }
    if (n + 1 > hn) return -1;
    memcpy(host, h0, n);
    host[n] = '\0';
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535) return -1;
    *port = (int)p;
    return 0;
}

http_server *http_start(const http_opts *o, ikbo_err *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, (void (*)(void))evthread_use_pthreads);

    char host[256];
    int port;
    if (split_listen(o->listen, host, sizeof host, &port)) {
        bk_seterr(err, "http: bad listen address '%.200s' (want host:port)", o->listen);
        return NULL;
    }
    http_server *h = calloc(1, sizeof *h);
    if (!h) {
        bk_seterr(err, "http: out of memory");
        return NULL;
    }
    h->o = *o;
    h->base = event_base_new();
    h->http = h->base ? evhttp_new(h->base) : NULL;
    h->stop_ev = h->http ? event_new(h->base, -1, 0, on_stop, h) : NULL;
    h->cancel_ev = h->stop_ev ? evtimer_new(h->base, on_cancel, h) : NULL;
    if (!h->cancel_ev) {
        bk_seterr(err, "http: cannot create the event loop");
        goto fail;
    }
    evhttp_set_max_body_size(h->http, o->max_body_bytes ? o->max_body_bytes : (1u << 22));
    evhttp_set_timeout(h->http, 60);
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_bevcb(h->http, new_bev, h);
    evhttp_set_gencb(h->http, handle, h);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(h->http, host, (uint16_t)port);
    if (!bs) {
        bk_seterr(err, "http: cannot listen on %.200s (address in use or invalid)", o->listen);
        goto fail;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    h->port = port;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0)
        h->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (pthread_create(&h->thread, NULL, http_main, h) != 0) {
        bk_seterr(err, "http: cannot start the thread");
        goto fail;
    }
    h->started = 1;
    return h;
fail:
    if (h->cancel_ev) event_free(h->cancel_ev);
    if (h->stop_ev) event_free(h->stop_ev);
    if (h->http) evhttp_free(h->http);
    if (h->base) event_base_free(h->base);
    free(h);
    return NULL;
}

int http_port(const http_server *h) { return h->port; }

void http_stop(http_server *h, int wait_ms)
{
    if (!h) return;
    if (h->started) {
        h->stop_wait_ms = wait_ms; /* read by on_stop, after event_active */
        event_active(h->stop_ev, EV_TIMEOUT, 1);
        pthread_join(h->thread, NULL);
    }
    event_free(h->cancel_ev);
    event_free(h->stop_ev);
    evhttp_free(h->http); /* conn_gone for every attached connection */
    while (h->conns) {    /* not attached yet */
        struct bufferevent *bev = h->conns->bev;
        event_free(h->conns->attach_ev);
        conn_free(h->conns);
        bufferevent_decref(bev);
    }
    event_base_free(h->base);
    free(h);
}
