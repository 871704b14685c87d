// sgd: distributed data-parallel SGD on synthetic data (the seeds' "distributed training"):
// each rank fits a linear model to its own shard of y = x . w_true + noise, and gradients are
// averaged with all_reduce, so every rank holds the same weights after every step and the loss
// falls. Run: drun --standalone --nproc-per-node 2 build/bin/sgd [--epochs N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "drun/comm/communicator.hpp"

using namespace drun::comm;

int main(int argc, char** argv) {
  int epochs = 20;
  if (argc > 2 && std::strcmp(argv[1], "--epochs") == 0) epochs = std::atoi(argv[2]);
  try {
    auto world = init();
    const int rank = world->rank();
    constexpr int kFeatures = 8, kSamples = 256;
    const std::vector<double> wTrue = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5, -2.0, 1.0};

    // This rank's shard: a different seed per rank.
    std::mt19937 gen(1234 + rank);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> x(kSamples * kFeatures), y(kSamples);
    for (int i = 0; i < kSamples; ++i) {
      double dot = 0;
      for (int f = 0; f < kFeatures; ++f) dot += (x[i * kFeatures + f] = normal(gen)) * wTrue[f];
      y[i] = dot + 0.01 * normal(gen);
    }

    std::vector<double> w(kFeatures, 0.0);
    const double lr = 0.1;
    double firstLoss = 0, loss = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      // grad[0..F) = d(mse)/dw on the shard, grad[F] = the shard's loss.
      std::vector<double> grad(kFeatures + 1, 0.0);
      for (int i = 0; i < kSamples; ++i) {
        double err = -y[i];
        for (int f = 0; f < kFeatures; ++f) err += x[i * kFeatures + f] * w[f];
        for (int f = 0; f < kFeatures; ++f) grad[f] += 2 * err * x[i * kFeatures + f] / kSamples;
        grad[kFeatures] += err * err / kSamples;
      }
      world->allReduce(grad.data(), grad.size(), DType::Float64, ReduceOp::Avg);
      for (int f = 0; f < kFeatures; ++f) w[f] -= lr * grad[f];
      loss = grad[kFeatures];
      if (epoch == 0) firstLoss = loss;
      if (rank == 0) std::printf("epoch %d loss %.6f\n", epoch, loss);
    }
    std::printf("rank %d: loss %.6f -> %.6f, weights", rank, firstLoss, loss);
    for (double v : w) std::printf(" %.12f", v);
    std::printf("\n");
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sgd: %s\n", e.what());
    return 1;
  }
}
