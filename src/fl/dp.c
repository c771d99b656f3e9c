/* The Renyi-DP accountant of DP-FedAvg (McMahan et al. 2018): each round samples clients with
 * rate q and adds Gaussian noise of std sigma * clip to the sum of clipped updates, i.e. one step
 * of the sampled Gaussian mechanism. Its RDP at integer order alpha is computed exactly in log
 * space (Mironov, Talwar, Zhang 2019, Sec. 3.3, integer alpha), composed over rounds, and turned
 * into (epsilon, delta) by eps = rdp + log(1/delta) / (alpha - 1) (Mironov 2017, Prop. 3),
 * minimised over alpha = 2..256. The round's sampling is treated as Poisson with q = C / K. */
#include "fl/fl.h"

#include <math.h>

static double log_add(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    double m = a > b ? a : b;
    return m + log1p(exp(-fabs(a - b)));
}

double dt_fl_rdp_step(double q, double sigma, int alpha) {
    if (q <= 0) return 0;
    if (sigma <= 0) return INFINITY;
    if (q >= 1) return alpha / (2.0 * sigma * sigma);
    /* A_alpha = sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2)) */
    double acc = -INFINITY;
    for (int k = 0; k <= alpha; k++) {
        double lbin = lgamma(alpha + 1.0) - lgamma(k + 1.0) - lgamma(alpha - k + 1.0);
        double t = lbin + (alpha - k) * log1p(-q) + k * log(q) + (double)(k * (k - 1)) / (2.0 * sigma * sigma);
        acc = log_add(acc, t);
    }
    return acc / (alpha - 1);
}

double dt_fl_dp_epsilon(double q, double sigma, int64_t steps, double delta, int *best_alpha) {
    double best = INFINITY;
    int ba = 0;
    for (int a = 2; a <= 256; a++) {
        double eps = (double)steps * dt_fl_rdp_step(q, sigma, a) + log(1.0 / delta) / (a - 1);
        if (eps < best) best = eps, ba = a;
    }
    if (best_alpha) *best_alpha = ba;
    return best;
}
