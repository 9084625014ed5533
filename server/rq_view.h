/* rq_view.h - a RankRequest's users and candidates as canonical rows
 * (rowset.h), from either encoding: the classic messages or the packed
 * columns. Private to the request path (validate.c builds it, request.c plans
 * from it).
 *
 * Why this exists: validation and the plan then read one shape, so the packed
 * encoding gets the same rules and the same messages as the classic one
 * without a second copy of either, and nothing is copied out of the request
 * to build it (rows point into the message or the wire bytes).
 *
 * Ownership: the view points into the request, which must outlive it;
 * rq_view_free releases its one allocation. Thread-safety: none needed.
 */
#ifndef IKBO_SERVER_RQ_VIEW_H
#define IKBO_SERVER_RQ_VIEW_H

#include "request.h"
#include "rowset.h"

typedef struct rq_view {
    rs_dims d;
    size_t n_users, n_cands;
    rs_row *users;      /* [n_users]; bags in model order, absent = empty */
    rs_row *cands;      /* [n_cands] */
    int32_t *cand_user; /* [n_cands], each < n_users */
    int64_t *cand_id;   /* [n_cands] Candidate.id */
    void *mem_;
} rq_view;

/* Builds the view. Always checks what memory safety needs (counts, packed
 * column sizes, dense widths, feature names known and unique, actions
 * lengths, candidate -> user indices); with lim also every limit and value
 * rule of rq_validate. 0, or -1 with *st set (*v then holds nothing). */
int rq_view_build(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                  const rq_limits *lim, rq_view *v, rq_status *st);
void rq_view_free(rq_view *v); /* idempotent */

#endif
