//! Which source bytes go into which JNF region: the layout is detected from tensor names and
//! shapes, never from the model type. Per-expert tensors (`experts.E.{gate,up,down}_proj`,
//! Mixtral's `experts.E.w{1,3,2}`) and fused 3-D stacks (`experts.gate_up_proj`, `experts.down_proj`
//! in either dimension order, sliced along the expert dimension) become expert extents; every other
//! tensor of a layer (attention, norms, router, correction bias, shared experts) is a plain tensor of
//! that layer; MTP layers (`model.layers.{num_hidden_layers}.*`, `mtp.*`) are layers too; the rest
//! is the trunk. Nothing is dropped.

use std::borrow::Cow;
use std::collections::BTreeMap;

use tarfa_format::{Dtype, Role};

use crate::error::{ConvertError, ExpertFault, SourceFault};
use crate::source::{Checkpoint, SourceTensor};

/// A byte range of a source tensor that becomes one region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Source tensor name.
    pub tensor: String,
    /// Shard index.
    pub shard: usize,
    /// Absolute begin offset in the shard.
    pub begin: u64,
    /// Absolute end offset.
    pub end: u64,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of the region.
    pub shape: Vec<u64>,
    /// Shape of the whole source tensor.
    pub src_shape: Vec<u64>,
}

impl Slice {
    /// The whole tensor.
    pub(crate) fn whole(t: &SourceTensor) -> Slice {
        Slice {
            tensor: t.name.clone(),
            shard: t.shard,
            begin: t.begin,
            end: t.end,
            dtype: t.dtype,
            shape: t.shape.clone(),
            src_shape: t.shape.clone(),
        }
    }

    /// Bytes of the region.
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.begin == self.end
    }
}

/// One region to write: its JNF name and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Region name in the JNF file.
    pub name: String,
    /// Projection role (`Role::Tensor` for plain tensors).
    pub role: Role,
    /// Where its bytes are.
    pub slice: Slice,
}

/// A fused stack sliced along its first (expert) dimension: expert `e`'s region is the
/// `len` bytes at `begin + e·stride` of the stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// Projection role.
    pub role: Role,
    /// Source tensor name.
    pub tensor: String,
    /// Shard index.
    pub shard: usize,
    /// Absolute offset of expert 0's region in the shard.
    pub begin: u64,
    /// Bytes from one expert's region to the next.
    pub stride: u64,
    /// Bytes of one expert's region.
    pub len: u64,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of one expert's region.
    pub shape: Vec<u64>,
    /// Shape of the whole stack.
    pub src_shape: Vec<u64>,
}

impl Stack {
    /// Expert `e`'s region.
    pub fn item(&self, e: u32) -> Item {
        let begin = self.begin + u64::from(e) * self.stride;
        Item {
            name: format!("{}[{e}]", self.tensor),
            role: self.role,
            slice: Slice {
                tensor: self.tensor.clone(),
                shard: self.shard,
                begin,
                end: begin + self.len,
                dtype: self.dtype,
                shape: self.shape.clone(),
                src_shape: self.src_shape.clone(),
            },
        }
    }
}

/// The experts of a layer.
#[derive(Clone, Debug)]
pub enum Experts {
    /// Per-expert tensors: each expert's projections in role order.
    Listed(Vec<Vec<Item>>),
    /// Fused stacks, in role order: `count` experts whose items are made when asked for, so a
    /// layer of a million experts costs a few stacks, not a million item lists.
    Stacked {
        /// Number of experts.
        count: u32,
        /// The stacks.
        stacks: Vec<Stack>,
    },
}

impl Default for Experts {
    fn default() -> Experts {
        Experts::Listed(Vec::new())
    }
}

impl Experts {
    /// Number of experts.
    pub fn len(&self) -> usize {
        match self {
            Experts::Listed(grid) => grid.len(),
            Experts::Stacked { count, .. } => *count as usize,
        }
    }

    /// Whether the layer has no experts.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Expert `e`'s projections in role order.
    pub fn expert(&self, e: usize) -> Vec<Cow<'_, Item>> {
        match self {
            Experts::Listed(grid) => grid[e].iter().map(Cow::Borrowed).collect(),
            Experts::Stacked { stacks, .. } => stacks
                .iter()
                .map(|s| Cow::Owned(s.item(e as u32)))
                .collect(),
        }
    }

    /// Bytes of region data.
    fn data_bytes(&self) -> u64 {
        match self {
            Experts::Listed(grid) => grid.iter().flatten().map(|i| i.slice.len()).sum(),
            Experts::Stacked { count, stacks } => {
                stacks.iter().map(|s| s.len * u64::from(*count)).sum()
            }
        }
    }
}

/// Everything of one layer.
#[derive(Clone, Debug, Default)]
pub struct LayerPlan {
    /// Plain tensors, in source order.
    pub plain: Vec<Item>,
    /// Experts `0..n`.
    pub experts: Experts,
    /// `"fused"` or `"per-expert"` (empty for a dense layer).
    pub expert_layout: &'static str,
}

impl LayerPlan {
    /// Bytes of region data.
    pub fn data_bytes(&self) -> u64 {
        self.plain.iter().map(|i| i.slice.len()).sum::<u64>() + self.experts.data_bytes()
    }

    /// Every item in write order (an expert of a fused stack is made as it comes).
    pub fn items(&self) -> impl Iterator<Item = Cow<'_, Item>> {
        self.plain
            .iter()
            .map(Cow::Borrowed)
            .chain((0..self.experts.len()).flat_map(|e| self.experts.expert(e)))
    }
}

/// The whole conversion.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Model-level tensors.
    pub trunk: Vec<Item>,
    /// Layers by index.
    pub layers: BTreeMap<u32, LayerPlan>,
    /// `num_hidden_layers` from the config (or the layers seen).
    pub num_hidden_layers: u32,
    /// Layers of the whole model, MTP layers included.
    pub num_layers: u32,
    /// Trunk tensors whose names tarfa does not recognise (kept all the same).
    pub unrecognised: Vec<String>,
    /// Tensors under `experts.E.` that are not a known projection (kept as plain tensors).
    pub loose_expert_tensors: Vec<String>,
}

impl Plan {
    /// Give `layer` its expert grid: each expert's projections in role order, checked uniform.
    pub(crate) fn set_experts(
        &mut self,
        layer: u32,
        mut grid: Vec<Vec<Item>>,
        layout: &'static str,
    ) -> Result<(), ConvertError> {
        for items in &mut grid {
            items.sort_by_key(|i| i.role.code());
        }
        check_uniform(layer, &grid)?;
        let lp = self.layers.entry(layer).or_default();
        lp.experts = Experts::Listed(grid);
        lp.expert_layout = layout;
        Ok(())
    }

    /// Give `layer` `count` experts cut from fused `stacks` (put in role order here); every
    /// expert has the same projections, so expert 0 is checked for all.
    pub(crate) fn set_stacks(
        &mut self,
        layer: u32,
        count: u32,
        mut stacks: Vec<Stack>,
    ) -> Result<(), ConvertError> {
        stacks.sort_by_key(|s| s.role.code());
        if count > 0 {
            check_uniform(layer, &[stacks.iter().map(|s| s.item(0)).collect()])?;
        }
        let lp = self.layers.entry(layer).or_default();
        lp.experts = Experts::Stacked { count, stacks };
        lp.expert_layout = "fused";
        Ok(())
    }

    /// Put the trunk's and each layer's plain tensors in source order (shard, offset), so files
    /// are written reading each shard forward.
    pub(crate) fn sort_by_source(&mut self) {
        let key = |i: &Item| (i.slice.shard, i.slice.begin);
        self.trunk.sort_by_key(key);
        for lp in self.layers.values_mut() {
            lp.plain.sort_by_key(key);
        }
    }
}

fn parse_u32(s: &str) -> Option<u32> {
    (!s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// An MTP tensor's name after its `mtp.` (Qwen3-Next) or `model.mtp.` (MiMo-V2-Flash) prefix.
fn mtp_rest(name: &str) -> Option<&str> {
    name.strip_prefix("mtp.")
        .or_else(|| name.strip_prefix("model.mtp."))
}

/// `(layer, rest)` for a layer tensor: `…layers.L.rest`, `[model.]mtp.layers.K.rest` (layer N+K)
/// or `[model.]mtp.rest` (layer N).
fn layer_of(name: &str, n_hidden: u32) -> Option<(u32, &str)> {
    if let Some(rest) = mtp_rest(name) {
        if let Some(r) = rest.strip_prefix("layers.") {
            if let Some((k, tail)) = r.split_once('.') {
                if let Some(k) = parse_u32(k) {
                    return Some((n_hidden.checked_add(k)?, tail));
                }
            }
        }
        return Some((n_hidden, rest));
    }
    let mut search = 0;
    while let Some(p) = name[search..].find("layers.") {
        let at = search + p;
        if at == 0 || name.as_bytes()[at - 1] == b'.' {
            let r = &name[at + 7..];
            if let Some((l, tail)) = r.split_once('.') {
                if let Some(l) = parse_u32(l) {
                    return Some((l, tail));
                }
            }
        }
        search = at + 7;
    }
    None
}

/// What an expert tensor is.
enum ExpertName {
    /// `experts.E.proj.{weight,bias}`.
    PerExpert(u32, Role),
    /// `experts.proj` stacked over experts.
    Fused(Role),
}

fn role_of_proj(proj: &str, bias: bool) -> Option<Role> {
    Some(match (proj, bias) {
        ("gate_proj" | "w1", false) => Role::Gate,
        ("up_proj" | "w3", false) => Role::Up,
        ("down_proj" | "w2", false) => Role::Down,
        ("gate_up_proj", false) => Role::GateUp,
        ("gate_proj" | "w1", true) => Role::GateBias,
        ("up_proj" | "w3", true) => Role::UpBias,
        ("down_proj" | "w2", true) => Role::DownBias,
        ("gate_up_proj", true) => Role::GateUpBias,
        _ => return None,
    })
}

/// Classify the part of a layer tensor's name after `layers.L.`; `Err(())` for a name under
/// `experts.` that is not a known projection.
fn expert_name(rest: &str) -> Result<Option<ExpertName>, ()> {
    let segs: Vec<&str> = rest.split('.').collect();
    let Some(i) = segs.iter().position(|s| *s == "experts") else {
        return Ok(None);
    };
    let tail = &segs[i + 1..];
    match tail {
        [e, proj, suffix] if parse_u32(e).is_some() => {
            let bias = match *suffix {
                "weight" => false,
                "bias" => true,
                _ => return Err(()),
            };
            let e = parse_u32(e).ok_or(())?;
            role_of_proj(proj, bias)
                .map(|r| Some(ExpertName::PerExpert(e, r)))
                .ok_or(())
        }
        [proj] | [proj, "weight"] => {
            let (p, bias) = match proj.strip_suffix("_bias") {
                Some(p) => (p, true),
                None => (*proj, false),
            };
            role_of_proj(p, bias)
                .map(|r| Some(ExpertName::Fused(r)))
                .ok_or(())
        }
        [proj, "bias"] => role_of_proj(proj, true)
            .map(|r| Some(ExpertName::Fused(r)))
            .ok_or(()),
        _ => Err(()),
    }
}

fn n_hidden_layers(config: &serde_json::Value) -> Option<u32> {
    let get = |v: &serde_json::Value| v.get("num_hidden_layers").and_then(|x| x.as_u64());
    get(config)
        .or_else(|| config.get("text_config").and_then(get))
        .and_then(|n| u32::try_from(n).ok())
}

fn is_known_trunk(name: &str) -> bool {
    ["embed_tokens.weight", "norm.weight", "lm_head.weight"]
        .iter()
        .any(|k| name == format!("model.{k}") || name == *k || name.ends_with(&format!(".{k}")))
}

/// Build the plan of a checkpoint.
pub fn plan(ck: &Checkpoint) -> Result<Plan, ConvertError> {
    let seen_max = ck
        .tensors
        .keys()
        .filter(|n| mtp_rest(n).is_none())
        .filter_map(|n| layer_of(n, 0).map(|(l, _)| l))
        .max();
    let n_hidden = n_hidden_layers(&ck.config).unwrap_or(seen_max.map_or(0, |m| m + 1));
    let mut plan = Plan {
        num_hidden_layers: n_hidden,
        ..Plan::default()
    };
    let mut per_expert: BTreeMap<u32, BTreeMap<u32, Vec<Item>>> = BTreeMap::new();
    let mut fused: BTreeMap<u32, Vec<(Role, &SourceTensor)>> = BTreeMap::new();
    for t in ck.tensors.values() {
        let Some((layer, rest)) = layer_of(&t.name, n_hidden) else {
            if !is_known_trunk(&t.name) {
                plan.unrecognised.push(t.name.clone());
            }
            plan.trunk.push(Item {
                name: t.name.clone(),
                role: Role::Tensor,
                slice: Slice::whole(t),
            });
            continue;
        };
        let lp = plan.layers.entry(layer).or_default();
        match expert_name(rest) {
            Ok(Some(ExpertName::PerExpert(e, role))) => {
                per_expert
                    .entry(layer)
                    .or_default()
                    .entry(e)
                    .or_default()
                    .push(Item {
                        name: t.name.clone(),
                        role,
                        slice: Slice::whole(t),
                    });
            }
            Ok(Some(ExpertName::Fused(role))) => fused.entry(layer).or_default().push((role, t)),
            Ok(None) => lp.plain.push(Item {
                name: t.name.clone(),
                role: Role::Tensor,
                slice: Slice::whole(t),
            }),
            Err(()) => {
                plan.loose_expert_tensors.push(t.name.clone());
                lp.plain.push(Item {
                    name: t.name.clone(),
                    role: Role::Tensor,
                    slice: Slice::whole(t),
                });
            }
        }
    }
    for (layer, experts) in per_expert {
        if fused.contains_key(&layer) {
            return Err(ConvertError::BadExperts {
                layer,
                fault: ExpertFault::MixedLayouts,
            });
        }
        let n = check_expert_count(layer, experts.keys().max().map_or(0, |m| u64::from(*m) + 1))?
            as u32;
        // Each expert present is a key: a missing one is found before a grid of `n` is allocated.
        if experts.len() != n as usize {
            let e = (0..n).find(|e| !experts.contains_key(e)).unwrap_or(0);
            return Err(ConvertError::BadExperts {
                layer,
                fault: ExpertFault::Missing {
                    expert: e,
                    count: n,
                },
            });
        }
        let plain = plan.layers.get(&layer).map_or(0, |lp| lp.plain.len());
        let first = experts
            .values()
            .flatten()
            .next()
            .map_or("", |i| i.name.as_str());
        let items: usize = experts.values().map(Vec::len).sum();
        check_index_bound(layer, first, u64::from(n), (items + plain) as u64)?;
        let mut grid = Vec::with_capacity(n as usize);
        for e in 0..n {
            let Some(items) = experts.get(&e).cloned() else {
                return Err(ConvertError::BadExperts {
                    layer,
                    fault: ExpertFault::Missing {
                        expert: e,
                        count: n,
                    },
                });
            };
            grid.push(items);
        }
        plan.set_experts(layer, grid, "per-expert")?;
    }
    for (layer, stacks) in fused {
        let n = stacks[0].1.shape.first().copied().unwrap_or(0);
        check_expert_count(layer, n)?;
        let plain = plan.layers.get(&layer).map_or(0, |lp| lp.plain.len());
        let regions = n
            .saturating_mul(stacks.len() as u64)
            .saturating_add(plain as u64);
        check_index_bound(layer, &stacks[0].1.name, n, regions)?;
        let mut cut = Vec::with_capacity(stacks.len());
        for (role, t) in &stacks {
            let want_rank = if matches!(
                role,
                Role::GateUpBias | Role::GateBias | Role::UpBias | Role::DownBias
            ) {
                2
            } else {
                3
            };
            if t.shape.len() != want_rank || t.shape[0] != n {
                return Err(ConvertError::BadExperts {
                    layer,
                    fault: ExpertFault::StackShape {
                        tensor: t.name.clone(),
                        shape: t.shape.clone(),
                        rank: want_rank,
                        count: n,
                    },
                });
            }
            let per = t.dtype.byte_len(&t.shape[1..]).unwrap_or(0);
            cut.push(Stack {
                role: *role,
                tensor: t.name.clone(),
                shard: t.shard,
                begin: t.begin,
                stride: per,
                len: per,
                dtype: t.dtype,
                shape: t.shape[1..].to_vec(),
                src_shape: t.shape.clone(),
            });
        }
        plan.set_stacks(layer, n as u32, cut)?;
    }
    plan.check_plain_bounds(ck)?;
    plan.sort_by_source();
    let max_layer = plan.layers.keys().max().map_or(0, |m| m + 1);
    // No absurd count from the tensors' own names (model.layers.999999999.*), said as such.
    if u64::from(max_layer) > tarfa_format::manifest::MAX_LAYERS {
        return Err(ConvertError::LayerCount {
            path: ck.dir.clone(),
            fault: tarfa_format::manifest::LayerCountFault::TooMany {
                key: "the highest layer its tensor names give (model.layers.N.*, + 1)".into(),
                count: u64::from(max_layer),
            },
        });
    }
    // No layer past those the config declares (it would never run), no absurd count there.
    tarfa_format::manifest::check_layer_count("safetensors", &ck.config, u64::from(max_layer))
        .map_err(|fault| ConvertError::LayerCount {
            path: ck.dir.join("config.json"),
            fault,
        })?;
    plan.num_layers = max_layer.max(n_hidden);
    Ok(plan)
}

/// Refuse an expert count no JNF file can hold, before anything is allocated for it: a header
/// may claim a stack of 10^12 zero-size experts, or an expert index of 999,999,999.
pub(crate) fn check_expert_count(layer: u32, n: u64) -> Result<usize, ConvertError> {
    let max = tarfa_format::validate::MAX_REGIONS;
    if n > max {
        return Err(ConvertError::BadExperts {
            layer,
            fault: ExpertFault::TooMany { count: n, max },
        });
    }
    Ok(n as usize)
}

/// Bytes of index records a file of `regions` regions and `experts` experts needs at least
/// (spec §6: `288·R + 96·E ≤ index_len ≤ MAX_INDEX_LEN`); strings come on top.
pub(crate) fn index_records_len(regions: u64, experts: u64) -> u64 {
    regions
        .saturating_mul(288)
        .saturating_add(experts.saturating_mul(96))
}

/// Refuse a layer whose file no JNF index can hold, before anything is allocated for its
/// experts: `n` experts (the first expert tensor is `tensor`) and `regions` regions in all (a
/// fused stack of `n` counts `n`). A header of a few hundred bytes may claim 4,194,304 zero-size
/// experts, which would need more than 1 GiB of records.
pub(crate) fn check_index_bound(
    layer: u32,
    tensor: &str,
    n: u64,
    regions: u64,
) -> Result<(), ConvertError> {
    check_file_bound(
        || tarfa_format::manifest::layer_file_name(layer),
        tensor,
        n,
        regions,
    )
}

/// Refuse a file of `experts` experts and `regions` regions whose records alone break the
/// spec's limits (`MAX_REGIONS`, `288·R + 96·E ≤ MAX_INDEX_LEN`).
fn check_file_bound(
    file: impl Fn() -> String,
    tensor: &str,
    experts: u64,
    regions: u64,
) -> Result<(), ConvertError> {
    let bytes = index_records_len(regions, experts);
    if regions > tarfa_format::validate::MAX_REGIONS
        || bytes > tarfa_format::validate::MAX_INDEX_LEN
    {
        return Err(ConvertError::IndexTooLarge {
            file: file(),
            tensor: tensor.to_string(),
            experts,
            regions,
            bytes,
        });
    }
    Ok(())
}

impl Plan {
    /// Refuse a trunk, or a layer without experts, whose records no JNF index can hold (a 99 MB
    /// header of zero-size tensors), before anything is written. Layers with experts were
    /// checked, with their plain tensors, before their grids were built.
    pub(crate) fn check_plain_bounds(&self, ck: &Checkpoint) -> Result<(), ConvertError> {
        self.check_names(ck)?;
        let first = |items: &[Item]| items.first().map_or(String::new(), |i| i.name.clone());
        check_file_bound(
            || tarfa_format::manifest::TRUNK_NAME.to_string(),
            &first(&self.trunk),
            0,
            self.trunk.len() as u64,
        )?;
        for (layer, lp) in &self.layers {
            if lp.experts.is_empty() {
                check_file_bound(
                    || tarfa_format::manifest::layer_file_name(*layer),
                    &first(&lp.plain),
                    0,
                    lp.plain.len() as u64,
                )?;
            }
        }
        Ok(())
    }

    /// Every region name, source tensor name and source file name is one a JNF file can hold
    /// (spec §5.1: at most `MAX_STRING_LEN` bytes, not empty, no NUL; a plain relative
    /// source path). A name that breaks this is the source's fault, refused before any file is
    /// written (the writer would refuse it too, but as a broken JNF rule or a misuse of itself).
    fn check_names(&self, ck: &Checkpoint) -> Result<(), ConvertError> {
        let max = tarfa_format::validate::MAX_STRING_LEN as usize;
        let all = self
            .trunk
            .iter()
            .map(Cow::Borrowed)
            .chain(self.layers.values().flat_map(LayerPlan::items));
        for item in all {
            let shard = ck.shards.get(item.slice.shard);
            let path = || shard.map_or_else(|| ck.dir.clone(), |s| s.path.clone());
            for name in [&item.name, &item.slice.tensor] {
                let fault = if name.len() > max {
                    let mut cut = 64;
                    while !name.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    SourceFault::NameTooLong {
                        prefix: name[..cut].to_string(),
                        len: name.len(),
                    }
                } else if name.is_empty() || name.contains('\0') {
                    SourceFault::BadName { name: name.clone() }
                } else {
                    continue;
                };
                return Err(ConvertError::BadSource {
                    path: path(),
                    fault,
                });
            }
            if let Some(s) = shard {
                let plain = s.rel.len() <= max
                    && tarfa_format::source_path::check_source_path(&s.rel).is_ok();
                if !plain {
                    return Err(ConvertError::BadSource {
                        path: path(),
                        fault: SourceFault::UnrecordableFileName {
                            name: s.rel.clone(),
                        },
                    });
                }
            }
        }
        Ok(())
    }
}

fn check_uniform(layer: u32, grid: &[Vec<Item>]) -> Result<(), ConvertError> {
    let roles = |items: &Vec<Item>| items.iter().map(|i| i.role).collect::<Vec<_>>();
    let Some(first) = grid.first().map(roles) else {
        return Ok(());
    };
    for (e, items) in grid.iter().enumerate() {
        let r = roles(items);
        if r.windows(2).any(|w| w[0] == w[1]) {
            return Err(ConvertError::BadExperts {
                layer,
                fault: ExpertFault::TwoForOneProjection { expert: e },
            });
        }
        if r != first {
            return Err(ConvertError::BadExperts {
                layer,
                fault: ExpertFault::ProjectionsDiffer {
                    expert: e,
                    has: r.iter().map(|x| x.name()).collect(),
                    first: first.iter().map(|x| x.name()).collect(),
                },
            });
        }
        let has = |x: Role| r.contains(&x);
        if has(Role::GateUp) && (has(Role::Gate) || has(Role::Up)) {
            return Err(ConvertError::BadExperts {
                layer,
                fault: ExpertFault::FusedBesideSeparate { expert: e },
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_are_found_in_every_naming_scheme() {
        assert_eq!(
            layer_of("model.layers.3.mlp.gate.weight", 48),
            Some((3, "mlp.gate.weight"))
        );
        assert_eq!(
            layer_of("model.language_model.layers.0.x", 48),
            Some((0, "x"))
        );
        assert_eq!(
            layer_of("mtp.layers.1.mlp.experts.2.up_proj.weight", 48),
            Some((49, "mlp.experts.2.up_proj.weight"))
        );
        assert_eq!(layer_of("mtp.fc.weight", 48), Some((48, "fc.weight")));
        // MiMo-V2-Flash's MTP layers come after the decoder's, not as layer K.
        assert_eq!(
            layer_of("model.mtp.layers.1.mlp.experts.2.up_proj.weight", 48),
            Some((49, "mlp.experts.2.up_proj.weight"))
        );
        assert_eq!(layer_of("model.embed_tokens.weight", 48), None);
        assert_eq!(
            layer_of("model.extra_layers.3.x", 48),
            None,
            "'layers' must be a whole segment"
        );
    }

    #[test]
    fn expert_projections_are_recognised_and_others_are_not() {
        let role = |s: &str| match expert_name(s) {
            Ok(Some(ExpertName::PerExpert(e, r))) => format!("{e}:{}", r.name()),
            Ok(Some(ExpertName::Fused(r))) => format!("fused:{}", r.name()),
            Ok(None) => "plain".into(),
            Err(()) => "loose".into(),
        };
        assert_eq!(role("mlp.experts.7.gate_proj.weight"), "7:gate");
        assert_eq!(role("block_sparse_moe.experts.0.w3.weight"), "0:up");
        assert_eq!(role("block_sparse_moe.experts.0.w2.weight"), "0:down");
        assert_eq!(role("mlp.experts.gate_up_proj"), "fused:gate_up");
        assert_eq!(role("mlp.experts.down_proj.weight"), "fused:down");
        assert_eq!(role("mlp.experts.gate_up_proj_bias"), "fused:gate_up_bias");
        assert_eq!(role("mlp.shared_experts.gate_proj.weight"), "plain");
        assert_eq!(role("mlp.shared_expert.up_proj.weight"), "plain");
        assert_eq!(role("mlp.experts.3.gate_proj.weight_scale_inv"), "loose");
    }
}
