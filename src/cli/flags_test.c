/* Tests for the flag parser's help layout and suggestions (flags.c, included whole so that its
 * static helpers are in reach): grouped --help order, a flag no group names landing in
 * "Advanced", "did you mean" for flags and names, and dtrain train's own groups. */
#include "cli/flags.c"
#include "cli/train_usage.c"
#include "cli/flag_terms.c"
#include "core/test.h"

static int a, b, c, d, e;
static const dt_flag g_flags[] = {
    {"epochs", DT_FLAG_INT, &a, "N", "passes"},
    {"data", DT_FLAG_INT, &b, "DIR", "data"},
    {"new-flag", DT_FLAG_INT, &c, "N", "added later, in no group"},
    {"threads", DT_FLAG_INT, &d, "N", "threads"},
    {"batch", DT_FLAG_INT, &e, "N", "batch"},
};
enum { NF = sizeof g_flags / sizeof *g_flags };

/* The groups name flags out of table order, one twice, and one the table lacks. */
static void test_order_with_advanced(void) {
    const dt_flag_group groups[] = {{"Data", "data"},
                                    {"Optimisation", "batch missing epochs batch"},
                                    {"Advanced", "threads"},
                                    {"Outputs", "data"},
                                    {NULL, NULL}};
    const dt_flag_help help = {"usage", groups, NULL};
    int order[NF], group[NF];
    int shown = dt_flags_help_order(&help, g_flags, NF, order, group);
    const int want_order[NF] = {1, 4, 0, 3, 2}, want_group[NF] = {0, 1, 1, 2, 2};
    for (int i = 0; i < NF; i++)
        CHECK_MSG(order[i] == want_order[i] && group[i] == want_group[i], "listed %d: flag %d in group %d", i, order[i],
                  group[i]);
    CHECK_MSG(shown == 3, "%d groups shown (Outputs names only a flag listed before)", shown);
    CHECK(!strcmp(dt_flags_group_title(&help, 2), "Advanced"));
}

/* Without a group titled Advanced, the flags no group names come last under an added one. */
static void test_added_advanced(void) {
    const dt_flag_group groups[] = {{"Data", "data epochs"}, {NULL, NULL}};
    const dt_flag_help help = {"usage", groups, NULL};
    int order[NF], group[NF];
    CHECK(dt_flags_help_order(&help, g_flags, NF, order, group) == 2);
    const int want_order[NF] = {1, 0, 2, 3, 4}, want_group[NF] = {0, 0, 1, 1, 1};
    for (int i = 0; i < NF; i++) CHECK(order[i] == want_order[i] && group[i] == want_group[i]);
    CHECK(!strcmp(dt_flags_group_title(&help, 1), "Advanced"));
    const dt_flag_help plain = {"usage", NULL, NULL}; /* no groups: the table's order, one list */
    CHECK(dt_flags_help_order(&plain, g_flags, NF, order, group) == 1);
    for (int i = 0; i < NF; i++) CHECK(order[i] == i && group[i] == 0);
    CHECK(!strcmp(dt_flags_group_title(&plain, 0), "Flags"));
}

static const char *or_empty(const char *s) { return s ? s : ""; }

static void test_suggest(void) {
    const char *cmds[] = {"train", "eval", "sample", "export", "predict", "plot", "man", "ckpt", "cache"};
    const int n = sizeof cmds / sizeof *cmds;
    CHECK(!strcmp(or_empty(dt_cli_suggest("trian", 5, cmds, n)), "train"));  /* two letters swapped */
    CHECK(!strcmp(or_empty(dt_cli_suggest("evl", 3, cmds, n)), "eval"));     /* one left out */
    CHECK(!strcmp(or_empty(dt_cli_suggest("pred", 4, cmds, n)), "predict")); /* the only one it starts */
    CHECK(!dt_cli_suggest("frobnicate", 10, cmds, n));                       /* a far miss */
    CHECK(!strcmp(or_empty(dt_cli_suggest("mat", 3, cmds, n)), "man"));      /* short: 1 edit at most */
    CHECK(!dt_cli_suggest("xa", 2, cmds, n));
    CHECK(!strcmp(or_empty(suggest_flag("epoch", 5, g_flags, NF)), "epochs"));
    CHECK(!strcmp(or_empty(suggest_flag("bacth", 5, g_flags, NF)), "batch"));
}

/* dtrain train's groups: the seven, in order, Advanced last, and no flag named twice. */
static void test_train_groups(void) {
    const char *want[] = {"Data",    "Model", "Optimisation", "Parallelism", "Outputs", "Checkpoints and faults",
                          "Advanced"};
    int g = 0;
    for (; dt_train_groups[g].title; g++) CHECK(g < 7 && !strcmp(dt_train_groups[g].title, want[g]));
    CHECK(g == 7);
    for (int i = 0; dt_train_groups[i].title; i++)
        for (const char *p = dt_train_groups[i].names; *p;) {
            size_t w = strcspn(p, " ");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)w, p);
            for (int j = i + 1; dt_train_groups[j].title; j++)
                CHECK_MSG(!names_hold(dt_train_groups[j].names, name), "--%s in two groups", name);
            p += w;
            while (*p == ' ') p++;
        }
}

/* The library's terms in backticks become flags; other backticked words, and text cut to fit, stay right. */
static void test_flag_terms(void) {
    char out[128];
    dt_cli_flag_terms("`grad_accum` 0: need 1..65536; `clip_norm` 2 x `batch`", out, sizeof out);
    CHECK_MSG(!strcmp(out, "--grad-accum 0: need 1..65536; --clip 2 x --batch"), "%s", out);
    dt_cli_flag_terms("run `bible` or `make CUDA=1`; `zero", out, sizeof out);
    CHECK_MSG(!strcmp(out, "run `bible` or `make CUDA=1`; `zero"), "%s", out);
    size_t n = dt_cli_flag_terms("`strategy` ps", out, 6);
    CHECK_MSG(n == 13 && !strcmp(out, "--str"), "%zu '%s'", n, out);
}

int main(void) {
    test_flag_terms();
    test_order_with_advanced();
    test_added_advanced();
    test_suggest();
    test_train_groups();
    return dt_test_summary("flags_test");
}
