#include "plan/eplb.h"

#include <algorithm>
#include <numeric>

namespace sy {

void BalancedPacking(const std::vector<double>& weights, int packs, std::vector<int>* pack,
                     std::vector<int>* position) {
  const size_t items = weights.size();
  const size_t per_pack = items / static_cast<size_t>(packs);
  pack->assign(items, 0);
  position->assign(items, 0);
  if (per_pack == 1) {  // one item each: nothing to balance
    std::iota(pack->begin(), pack->end(), 0);
    return;
  }
  std::vector<size_t> order(items);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  std::vector<double> pack_weight(static_cast<size_t>(packs), 0.0);
  std::vector<size_t> pack_items(static_cast<size_t>(packs), 0);
  for (size_t item : order) {
    int lightest = -1;
    for (int p = 0; p < packs; ++p)
      if (pack_items[p] < per_pack && (lightest < 0 || pack_weight[p] < pack_weight[lightest]))
        lightest = p;
    (*pack)[item] = lightest;
    (*position)[item] = static_cast<int>(pack_items[lightest]++);
    pack_weight[lightest] += weights[item];
  }
}

std::vector<int32_t> ReplicateExperts(const std::vector<double>& weights, int64_t physical,
                                      std::vector<int>* replicas) {
  const size_t logical = weights.size();
  std::vector<int32_t> to_logical(static_cast<size_t>(physical));
  std::iota(to_logical.begin(), to_logical.begin() + static_cast<int64_t>(logical), 0);
  replicas->assign(logical, 1);
  for (size_t p = logical; p < static_cast<size_t>(physical); ++p) {
    size_t hottest = 0;
    for (size_t e = 1; e < logical; ++e)
      if (weights[e] / (*replicas)[e] > weights[hottest] / (*replicas)[hottest]) hottest = e;
    to_logical[p] = static_cast<int32_t>(hottest);
    ++(*replicas)[hottest];
  }
  return to_logical;
}

bool UsesHierarchicalPolicy(const EplbOptions& o) {
  return o.groups % o.nodes == 0;
}

void RefineForExchanges(std::vector<int32_t>& slots, const std::vector<double>& load,
                        const std::vector<std::vector<int64_t>>& exchanges, int64_t per_rank,
                        int nodes, int64_t budget) {
  const size_t P = slots.size();
  if (exchanges.empty() || per_rank <= 0 || P % static_cast<size_t>(per_rank) != 0) return;
  const int N = static_cast<int>(P / static_cast<size_t>(per_rank));
  if (nodes < 1 || N % nodes != 0 || N < 2) return;
  const int ranks_per_node = N / nodes;
  // Row 0: the window's sum; rows 1..T: the sampled exchanges. Each row is weighted by the
  // inverse of its mean rank load, so both terms of the objective are ratios.
  std::vector<std::vector<double>> rows;
  rows.push_back(load);
  for (const auto& sample : exchanges)
    rows.emplace_back(sample.begin(), sample.end());
  const size_t T = rows.size();
  std::vector<int> replicas(load.size(), 0);
  for (int32_t e : slots)
    ++replicas[static_cast<size_t>(e)];
  std::vector<double> weight(T, 0.0);
  double samples_mean = 0;
  for (size_t t = 0; t < T; ++t) {
    double total = 0;
    for (double v : rows[t])
      total += v;
    if (t == 0)
      weight[t] = total > 0 ? N / total : 0;
    else
      samples_mean += total / N;
  }
  for (size_t t = 1; t < T; ++t)
    weight[t] = samples_mean > 0 ? 1 / samples_mean : 0;
  auto share = [&](size_t t, size_t p) {
    const int32_t e = slots[p];
    return rows[t][static_cast<size_t>(e)] / replicas[static_cast<size_t>(e)];
  };
  std::vector<std::vector<double>> rank_load(T, std::vector<double>(static_cast<size_t>(N), 0.0));
  for (size_t t = 0; t < T; ++t)
    for (size_t p = 0; p < P; ++p)
      rank_load[t][p / static_cast<size_t>(per_rank)] += share(t, p);
  auto holds = [&](int rank, int32_t e, size_t except) {
    for (size_t p = static_cast<size_t>(rank) * per_rank;
         p < static_cast<size_t>(rank + 1) * per_rank; ++p)
      if (p != except && slots[p] == e) return true;
    return false;
  };
  int64_t spent = 0;
  bool improved = true;
  while (improved && spent < budget) {
    improved = false;
    for (int a = 0; a < N && !improved && spent < budget; ++a) {
      const int node_end = (a / ranks_per_node + 1) * ranks_per_node;
      for (int b = a + 1; b < node_end && !improved && spent < budget; ++b) {
        // The busiest rank other than a and b in each row.
        std::vector<double> others(T, 0.0);
        for (size_t t = 0; t < T; ++t)
          for (int r = 0; r < N; ++r)
            if (r != a && r != b) others[t] = std::max(others[t], rank_load[t][r]);
        for (size_t i = static_cast<size_t>(a) * per_rank;
             i < static_cast<size_t>(a + 1) * per_rank && !improved; ++i)
          for (size_t j = static_cast<size_t>(b) * per_rank;
               j < static_cast<size_t>(b + 1) * per_rank && !improved; ++j) {
            if (slots[i] == slots[j] || holds(a, slots[j], i) || holds(b, slots[i], j)) continue;
            double delta = 0;
            for (size_t t = 0; t < T; ++t) {
              const double si = share(t, i), sj = share(t, j);
              const double la = rank_load[t][a], lb = rank_load[t][b];
              const double before = std::max({others[t], la, lb});
              const double after = std::max({others[t], la - si + sj, lb - sj + si});
              delta += weight[t] * (after - before);
            }
            spent += static_cast<int64_t>(T);
            if (delta < -1e-9) {
              for (size_t t = 0; t < T; ++t) {
                const double si = share(t, i), sj = share(t, j);
                rank_load[t][a] += sj - si;
                rank_load[t][b] += si - sj;
              }
              std::swap(slots[i], slots[j]);
              improved = true;
            }
          }
      }
    }
  }
}

std::vector<int32_t> RebalanceLayer(const std::vector<double>& load, const EplbOptions& o,
                                    bool hierarchical,
                                    const std::vector<std::vector<int64_t>>& exchanges) {
  const int64_t experts = static_cast<int64_t>(load.size());
  const int64_t groups = hierarchical ? o.groups : 1;
  const int nodes = hierarchical ? o.nodes : 1;
  const int64_t group_size = experts / groups, groups_per_node = groups / nodes;
  const int64_t physical = experts + o.redundant;
  const int64_t per_rank = physical / o.ranks, ranks_per_node = o.ranks / nodes;
  const int64_t experts_per_node = experts / nodes, physical_per_node = physical / nodes;

  // 1. Groups onto nodes. "Node-major" ids: node n's experts are [n·E/nodes, (n+1)·E/nodes).
  std::vector<double> group_load(static_cast<size_t>(groups), 0.0);
  for (int64_t e = 0; e < experts; ++e)
    group_load[e / group_size] += load[e];
  std::vector<int> group_node, group_position;
  BalancedPacking(group_load, nodes, &group_node, &group_position);
  std::vector<int64_t> node_major_to_logical(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t g = e / group_size;
    node_major_to_logical[(group_node[g] * groups_per_node + group_position[g]) * group_size +
                          e % group_size] = e;
  }

  std::vector<int32_t> slots(static_cast<size_t>(physical));
  for (int n = 0; n < nodes; ++n) {
    // 2. Replicas within the node.
    std::vector<double> node_load(static_cast<size_t>(experts_per_node));
    for (int64_t i = 0; i < experts_per_node; ++i)
      node_load[i] = load[node_major_to_logical[n * experts_per_node + i]];
    std::vector<int> replicas;
    const std::vector<int32_t> to_local = ReplicateExperts(node_load, physical_per_node, &replicas);
    // 3. The node's physical experts onto its ranks, each carrying its share of the load.
    std::vector<double> replica_load(static_cast<size_t>(physical_per_node));
    for (int64_t p = 0; p < physical_per_node; ++p)
      replica_load[p] = node_load[to_local[p]] / replicas[to_local[p]];
    std::vector<int> rank, position;
    BalancedPacking(replica_load, static_cast<int>(ranks_per_node), &rank, &position);
    for (int64_t p = 0; p < physical_per_node; ++p) {
      const int64_t slot = n * physical_per_node + rank[p] * per_rank + position[p];
      slots[slot] = static_cast<int32_t>(node_major_to_logical[n * experts_per_node + to_local[p]]);
    }
  }
  RefineForExchanges(slots, load, exchanges, per_rank, nodes);
  return slots;
}

Result<ExpertPlacement> RebalanceExperts(const ExpertLoad& load, const EplbOptions& o) {
  const int64_t experts = load.experts;
  if (o.ranks < 1) return Status::Errorf("--ep {} must be positive", o.ranks);
  if (o.nodes < 1 || o.ranks % o.nodes != 0)
    return Status::Errorf("--nodes {} does not divide --ep {}", o.nodes, o.ranks);
  if (o.redundant < 0) return Status::Errorf("--num-redundant-experts {} is negative", o.redundant);
  if ((experts + o.redundant) % o.ranks != 0)
    return Status::Errorf(
        "{} experts + {} redundant cannot be spread evenly over {} ranks (choose R so that "
        "E + R divides by --ep)",
        experts, o.redundant, o.ranks);
  if (o.groups < 1 || experts % o.groups != 0)
    return Status::Errorf("{} expert groups do not divide the {} experts", o.groups, experts);
  const bool hierarchical = UsesHierarchicalPolicy(o);
  if (hierarchical && (experts / o.groups) * (o.groups / o.nodes) * o.nodes != experts)
    return Status::Errorf("{} experts do not split evenly over {} nodes", experts, o.nodes);
  ExpertPlacement p;
  p.experts = experts;
  p.ranks = o.ranks;
  p.slots_per_rank = (experts + o.redundant) / o.ranks;
  p.layers = load.layers;
  for (size_t l = 0; l < load.counts.size(); ++l) {
    std::vector<double> layer_load(load.counts[l].begin(), load.counts[l].end());
    p.physical.push_back(RebalanceLayer(
        layer_load, o, hierarchical,
        l < load.exchanges.size() ? load.exchanges[l] : std::vector<std::vector<int64_t>>{}));
  }
  return p;
}

ExpertPlacement KeepHeldExperts(const ExpertPlacement& next, const ExpertPlacement& current,
                                int nodes) {
  ExpertPlacement out = next;
  const int N = next.ranks;
  const int64_t S = next.slots_per_rank;
  if (N != current.ranks || S != current.slots_per_rank || nodes < 1 || N % nodes != 0) return out;
  const int per_node = N / nodes;
  for (size_t l = 0; l < next.layers.size(); ++l) {
    const std::vector<int32_t>* now = current.Layer(next.layers[l]);
    if (now == nullptr) continue;
    std::vector<std::vector<bool>> had(static_cast<size_t>(N),
                                       std::vector<bool>(static_cast<size_t>(next.experts)));
    for (int r = 0; r < N; ++r)
      for (int32_t e : HeldExperts(*now, S, r))
        had[static_cast<size_t>(r)][static_cast<size_t>(e)] = true;
    struct Pair {
      int shared, bin, rank;
    };
    std::vector<Pair> pairs;
    for (int bin = 0; bin < N; ++bin) {
      const std::vector<int32_t> held = HeldExperts(next.physical[l], S, bin);
      const int node = bin / per_node;
      for (int rank = node * per_node; rank < (node + 1) * per_node; ++rank) {
        int shared = 0;
        for (int32_t e : held)
          shared += had[static_cast<size_t>(rank)][static_cast<size_t>(e)] ? 1 : 0;
        pairs.push_back({shared, bin, rank});
      }
    }
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const Pair& a, const Pair& b) { return a.shared > b.shared; });
    std::vector<int> rank_of(static_cast<size_t>(N), -1);
    std::vector<bool> taken(static_cast<size_t>(N), false);
    for (const Pair& p : pairs)
      if (rank_of[static_cast<size_t>(p.bin)] < 0 && !taken[static_cast<size_t>(p.rank)]) {
        rank_of[static_cast<size_t>(p.bin)] = p.rank;
        taken[static_cast<size_t>(p.rank)] = true;
      }
    std::vector<int32_t>& slots = out.physical[l];
    for (int bin = 0; bin < N; ++bin)
      std::copy_n(next.physical[l].begin() + bin * S, S,
                  slots.begin() + rank_of[static_cast<size_t>(bin)] * S);
  }
  return out;
}

}  // namespace sy
