/* auto_fixture.h - a broadcast-form ("planning": "auto") model that mixes
 * every rewrite of MODEL_FORMAT.md's "Automatic planning" with uses that
 * cannot be rewritten; shared by test_auto_plan.c (the plan) and
 * test_accounting.c (the bytes). Header-only.
 *
 * Layers and what the planner must make of them:
 *   ud, ut, uv   user-only                                   -> user (U rows)
 *   st           stack [ce, ut, cd, ue], tokens c u u c u   -> map_read (flat needs it whole)
 *   tl           token_linear over st                       -> type1: lce, weight split by token
 *   dt           dot_interaction over st                    -> ikbo over st's parts
 *   cc           concat [ue, cd, user.dense]                -> map_read (ln needs it whole)
 *   l1, l2       linear over cc (relu, none)                -> type1: user linear + candidate linear
 *   cr           cross with a user x0                       -> gather of ue
 *   mx           mixture with a user expert                 -> gather of uv
 *   m            mul of user and candidate                  -> ikbo (map read)
 */
#ifndef IKBO_AUTO_FIXTURE_H
#define IKBO_AUTO_FIXTURE_H

static const char *AUTO_JSON =
    "{\"format\": \"ikbo-model/1\", \"planning\": \"auto\","
    " \"inputs\": {\"user\": {\"dense\": 5, \"sparse\": [\"u\"]},"
    "             \"candidate\": {\"dense\": 3, \"sparse\": [\"c\"]}},"
    " \"tables\": {\"t\": {\"rows\": 40, \"dim\": 8}},"
    " \"layers\": ["
    "  {\"name\": \"ue\", \"op\": \"embedding_bag\", \"input\": \"user.sparse.u\", \"table\": \"t\", \"pooling\": \"sum\"},"
    "  {\"name\": \"ud\", \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 16, \"activation\": \"gelu\"},"
    "  {\"name\": \"ut\", \"op\": \"reshape\", \"input\": \"ud\", \"tokens\": 2},"
    "  {\"name\": \"uv\", \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 8},"
    "  {\"name\": \"ce\", \"op\": \"embedding_bag\", \"input\": \"candidate.sparse.c\", \"table\": \"t\", \"pooling\": \"mean\"},"
    "  {\"name\": \"cd\", \"op\": \"linear\", \"input\": \"candidate.dense\", \"out\": 8, \"activation\": \"silu\"},"
    "  {\"name\": \"st\", \"op\": \"stack\", \"inputs\": [\"ce\", \"ut\", \"cd\", \"ue\"]},"
    "  {\"name\": \"tl\", \"op\": \"token_linear\", \"input\": \"st\", \"out_tokens\": 3},"
    "  {\"name\": \"dt\", \"op\": \"dot_interaction\", \"inputs\": [\"st\"]},"
    "  {\"name\": \"cc\", \"op\": \"concat\", \"inputs\": [\"ue\", \"cd\", \"user.dense\"]},"
    "  {\"name\": \"l1\", \"op\": \"linear\", \"input\": \"cc\", \"out\": 8, \"activation\": \"relu\"},"
    "  {\"name\": \"l2\", \"op\": \"linear\", \"input\": \"cc\", \"out\": 4},"
    "  {\"name\": \"flat\", \"op\": \"flatten\", \"input\": \"st\"},"
    "  {\"name\": \"ln\", \"op\": \"layer_norm\", \"input\": \"cc\"},"
    "  {\"name\": \"cr\", \"op\": \"cross\", \"x0\": \"ue\", \"input\": \"l1\"},"
    "  {\"name\": \"g\", \"op\": \"linear\", \"input\": \"l2\", \"out\": 2},"
    "  {\"name\": \"mx\", \"op\": \"mixture\", \"experts\": [\"l1\", \"uv\"], \"gate\": \"g\"},"
    "  {\"name\": \"m\", \"op\": \"mul\", \"inputs\": [\"ue\", \"cd\"]},"
    "  {\"name\": \"tf\", \"op\": \"flatten\", \"input\": \"tl\"},"
    "  {\"name\": \"x\", \"op\": \"concat\", \"inputs\": [\"tf\", \"dt\", \"flat\", \"ln\", \"cr\", \"mx\", \"m\"]},"
    "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"x\", \"out\": 2}"
    " ],"
    " \"output\": {\"logits\": \"logits\", \"tasks\": [\"a\", \"b\"]}}";

/* Its two gathers: ue [8] and uv [8], fp32, per candidate. */
#define AUTO_GATHER_BYTES (2 * 8 * 4)

#endif
