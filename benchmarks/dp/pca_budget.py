"""What DP-PCA's share costs DP-SGD: the noise multiplier DP-SGD is calibrated to when the
projection spends ``pca_epsilon`` of the budget first (one Gaussian release, composed with the
steps by dp_accounting), against none. MNIST's shape: N = 60,000, expected batch 512, 2000 steps.

    python benchmarks/dp/pca_budget.py --epsilons 0.5,2,8 --pca-epsilons 0,0.1,0.2,0.5
"""

from __future__ import annotations

import argparse
import json

from zoo.dp.accounting import calibrate_gaussian, calibrate_noise_multiplier, epsilon_spent


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epsilons", default="0.5,2,8")
    p.add_argument("--pca-epsilons", default="0,0.1,0.2,0.5")
    p.add_argument("--records", type=int, default=60000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--delta", type=float, default=1e-5)
    args = p.parse_args(argv)
    q = args.batch / args.records
    for eps in map(float, args.epsilons.split(",")):
        for share in map(float, args.pca_epsilons.split(",")):
            if share >= eps:
                continue
            pca = calibrate_gaussian(epsilon=share, delta=args.delta) if share else None
            kw = dict(delta=args.delta, sampling_prob=q, steps=args.steps, pca_noise_multiplier=pca)
            sigma = calibrate_noise_multiplier(epsilon=eps, **kw)
            row = {
                "epsilon": eps,
                "pca_epsilon": share,
                "pca_noise_multiplier": pca,
                "sgd_noise_multiplier": sigma,
                "epsilon_total": epsilon_spent(noise_multiplier=sigma, **kw),
                "epsilon_sgd_alone": epsilon_spent(
                    noise_multiplier=sigma, delta=args.delta, sampling_prob=q, steps=args.steps
                ),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
