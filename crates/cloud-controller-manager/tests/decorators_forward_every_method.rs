//! Issue #52 item 3: the manager wraps the provider in two decorators, `MeteredCloud` (the cloud-call
//! metrics and the leadership fence, around every call) and `ShadowCloud` (`--dry-run`). A method a
//! trait gains with a default body compiles without being forwarded, and the decorator then answers
//! the default (often `NotImplemented`) instead of the provider: it happened with the orphan sweep's
//! method. These tests parse the traits and the impls with `syn` and fail naming every method left out.
//!
//! Part of the forwarding is written by declarative macros, which the tests read too: the `forward_…`
//! macros of `src/forward.rs` (methods invoked inside an impl), and `metered!` (a whole impl for
//! `MeteredCloud`, from the signatures its invocation lists).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::{
    Ident, ImplItem, Item, ItemMacro, Macro, Token, TraitItem, TraitItemFn, Type, braced,
    parenthesized,
    parse::{ParseStream, Parser},
};

/// The decorators, the file each lives in, and the traits each must implement: the metered cloud wraps
/// every part, the shadow cloud the parts that write (the others it hands out as they are).
const DECORATORS: &[(&str, &str, &[&str])] = &[
    (
        "MeteredCloud",
        "src/cloud_metrics.rs",
        &[
            "CloudProvider",
            "LoadBalancer",
            "Instances",
            "InstancesV2",
            "Zones",
            "Clusters",
            "Routes",
        ],
    ),
    (
        "ShadowCloud",
        "src/shadow/cloud.rs",
        &["CloudProvider", "LoadBalancer", "Routes"],
    ),
];

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|err| panic!("parsing {}: {err}", path.display()))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Every public trait of the `cloud-provider` crate and the methods it declares.
fn provider_traits() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cloud-provider/src");
    let mut traits = BTreeMap::new();
    for file in rust_files(&src) {
        for item in parse(&file).items {
            if let Item::Trait(t) = item {
                let methods = t
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        TraitItem::Fn(f) => Some(f.sig.ident.to_string()),
                        _ => None,
                    })
                    .collect();
                traits.insert(t.ident.to_string(), methods);
            }
        }
    }
    traits
}

/// The file of the macros that write methods inside a decorator's impl.
const FORWARD_MACROS: &str = "src/forward.rs";

/// The macros that write a whole trait impl for a decorator or a provider's cloud: (the macro, the file
/// defining and invoking it, the type it implements for, the reader of an invocation).
type ImplMacro = (&'static str, &'static str, &'static str, ImplReader);
const IMPL_MACROS: &[ImplMacro] = &[
    (
        "metered",
        "src/cloud_metrics.rs",
        "MeteredCloud",
        metered_impl,
    ),
    (
        "impl_through_part",
        "../../providers/aws/src/lib.rs",
        "AwsCloud",
        through_part_impl,
    ),
];

/// Reads an invocation of an impl macro: the trait and the methods the impl has.
type ImplReader = fn(ParseStream) -> syn::Result<(String, BTreeSet<String>)>;

/// The methods each `macro_rules!` of `file` writes, for the macros without arguments whose body is
/// methods (`() => { fn …; fn … };`), by macro name.
fn method_macros(file: &str) -> BTreeMap<String, BTreeSet<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let mut macros = BTreeMap::new();
    for item in parse(&path).items {
        let Item::Macro(ItemMacro {
            ident: Some(name),
            mac,
            ..
        }) = item
        else {
            continue;
        };
        let body = |input: ParseStream| {
            let _arguments;
            parenthesized!(_arguments in input);
            input.parse::<Token![=>]>()?;
            let methods;
            braced!(methods in input);
            input.parse::<Option<Token![;]>>()?;
            let mut names = BTreeSet::new();
            while !methods.is_empty() {
                if let ImplItem::Fn(f) = methods.parse::<ImplItem>()? {
                    names.insert(f.sig.ident.to_string());
                }
            }
            Ok(names)
        };
        if let Ok(names) = body.parse2(mac.tokens) {
            macros.insert(name.to_string(), names);
        }
    }
    macros
}

/// The methods the forwarding macro `name` writes.
fn forwarded_methods(name: &str) -> BTreeSet<String> {
    method_macros(FORWARD_MACROS)
        .remove(name)
        .unwrap_or_else(|| panic!("{name}!: no such macro of methods in {FORWARD_MACROS}"))
}

/// The methods a forwarding macro invoked in an impl writes: for `offer_wrapped_parts!(part: Trait, …)`
/// the accessors it names, for the others those their body writes.
fn invoked_methods(mac: &Macro) -> BTreeSet<String> {
    let name = mac.path.segments.last().unwrap().ident.to_string();
    if name != "offer_wrapped_parts" {
        return forwarded_methods(&name);
    }
    let parts = |input: ParseStream| {
        let mut names = BTreeSet::new();
        while !input.is_empty() {
            names.insert(input.parse::<Ident>()?.to_string());
            input.parse::<Token![:]>()?;
            input.parse::<Ident>()?;
            input.parse::<Option<Token![,]>>()?;
        }
        Ok(names)
    };
    parts
        .parse2(mac.tokens.clone())
        .unwrap_or_else(|err| panic!("reading {name}!: {err}"))
}

/// A `metered!(Trait via part [with forward_macro] { async fn …; … })` invocation.
fn metered_impl(input: ParseStream) -> syn::Result<(String, BTreeSet<String>)> {
    let name: Ident = input.parse()?;
    let _via: Ident = input.parse()?;
    let _part: Ident = input.parse()?;
    let mut methods = BTreeSet::new();
    if !input.peek(syn::token::Brace) {
        let _with: Ident = input.parse()?;
        let forwarded: Ident = input.parse()?;
        methods.extend(forwarded_methods(&forwarded.to_string()));
    }
    let listed;
    braced!(listed in input);
    while !listed.is_empty() {
        methods.insert(listed.parse::<TraitItemFn>()?.sig.ident.to_string());
    }
    Ok((name.to_string(), methods))
}

/// An `impl_through_part! { impl Trait => part { methods written out } fn …; … }` invocation.
fn through_part_impl(input: ParseStream) -> syn::Result<(String, BTreeSet<String>)> {
    input.parse::<Token![impl]>()?;
    let name: Ident = input.parse()?;
    input.parse::<Token![=>]>()?;
    let _part: Ident = input.parse()?;
    let own;
    braced!(own in input);
    let mut methods = BTreeSet::new();
    while !own.is_empty() {
        if let ImplItem::Fn(f) = own.parse::<ImplItem>()? {
            methods.insert(f.sig.ident.to_string());
        }
    }
    while !input.is_empty() {
        methods.insert(input.parse::<TraitItemFn>()?.sig.ident.to_string());
    }
    Ok((name.to_string(), methods))
}

/// The methods of each trait impl for `decorator` in `file` (from this crate's directory), by trait
/// name: the impls written out, with the methods of the forwarding macros they invoke, and those the
/// impl macros of [`IMPL_MACROS`] write.
fn decorator_impls(decorator: &str, file: &str) -> BTreeMap<String, BTreeSet<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let mut impls = BTreeMap::new();
    for item in parse(&path).items {
        if let Item::Macro(ItemMacro {
            ident: None, mac, ..
        }) = &item
            && let Some((name, _, _, reader)) =
                IMPL_MACROS.iter().find(|(name, in_file, for_type, _)| {
                    mac.path.is_ident(name) && *in_file == file && *for_type == decorator
                })
        {
            let (name, methods) = reader
                .parse2(mac.tokens.clone())
                .unwrap_or_else(|err| panic!("reading {name}! in {file}: {err}"));
            impls.insert(name, methods);
            continue;
        }
        let Item::Impl(imp) = item else { continue };
        let Some((_, trait_path, _)) = &imp.trait_ else {
            continue;
        };
        let Type::Path(self_ty) = imp.self_ty.as_ref() else {
            continue;
        };
        if !self_ty.path.is_ident(decorator) {
            continue;
        }
        let name = trait_path.segments.last().unwrap().ident.to_string();
        let mut methods = BTreeSet::new();
        for item in &imp.items {
            match item {
                ImplItem::Fn(f) => {
                    methods.insert(f.sig.ident.to_string());
                }
                ImplItem::Macro(m) => methods.extend(invoked_methods(&m.mac)),
                _ => {}
            }
        }
        impls.insert(name, methods);
    }
    impls
}

#[test]
fn every_decorator_forwards_every_method_of_the_traits_it_wraps() {
    let traits = provider_traits();
    let mut missing = Vec::new();
    for (decorator, file, wrapped) in DECORATORS {
        let impls = decorator_impls(decorator, file);
        for name in *wrapped {
            let declared = traits
                .get(*name)
                .unwrap_or_else(|| panic!("no trait {name} in the cloud-provider crate"));
            let Some(forwarded) = impls.get(*name) else {
                missing.push(format!("{decorator} does not implement {name} ({file})"));
                continue;
            };
            for method in declared.difference(forwarded) {
                missing.push(format!(
                    "{decorator} does not forward {name}::{method} ({file}): through it the \
                     method answers the trait's default, not the provider's"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The check itself: it sees the traits and methods it is meant to see (a parser that found nothing
/// would pass the test above vacuously).
#[test]
fn the_check_reads_the_traits_and_the_decorators() {
    let traits = provider_traits();
    for (name, method) in [
        ("LoadBalancer", "list_load_balancers"),
        ("LoadBalancer", "ensure_load_balancer"),
        ("CloudProvider", "hand_off"),
        ("Routes", "create_route"),
    ] {
        assert!(
            traits.get(name).is_some_and(|m| m.contains(method)),
            "{name}::{method} not read from the cloud-provider crate: {traits:?}"
        );
    }
    let metered = decorator_impls("MeteredCloud", "src/cloud_metrics.rs");
    assert!(metered["LoadBalancer"].contains("delete_orphaned_load_balancer"));
    assert!(metered["LoadBalancer"].contains("retains_load_balancers"));
    assert!(metered["Zones"].contains("get_zone_by_node_name"));
    assert!(metered["CloudProvider"].contains("owns_provider_id"));
    assert!(metered["CloudProvider"].contains("instances_v2"));
    let shadow = decorator_impls("ShadowCloud", "src/shadow/cloud.rs");
    assert!(shadow["Routes"].contains("create_route"));
    assert!(shadow["LoadBalancer"].contains("backend_label_keys"));
    assert!(
        shadow["CloudProvider"].contains("routes") && shadow["CloudProvider"].contains("zones")
    );
    // The impl macros write their impl for the decorator named, one method a signature listed.
    for (name, file, decorator, _) in IMPL_MACROS {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let definition = parse(&path)
            .items
            .into_iter()
            .find_map(|item| match item {
                Item::Macro(ItemMacro {
                    ident: Some(ident),
                    mac,
                    ..
                }) if ident == name => Some(mac.tokens.to_string().replace(' ', "")),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no macro_rules! {name} in {file}"));
        assert!(
            definition.contains(&format!("impl$traitfor{decorator}"))
                && definition.contains("$(asyncfn$"),
            "{name}! does not write one method of {decorator} a signature: {definition}"
        );
    }
}

/// A provider's cloud that hands a trait's calls to a part of its own, forwarding by hand: (the trait,
/// the cloud and its file, the part and its file), files from this crate's directory.
const PROVIDER_FORWARDERS: [(&str, &str, &str, &str, &str); 3] = [
    (
        "LoadBalancer",
        "AwsCloud",
        "../../providers/aws/src/lib.rs",
        "LoadBalancers",
        "../../providers/aws/src/load_balancer/mod.rs",
    ),
    (
        "InstancesV2",
        "AwsCloud",
        "../../providers/aws/src/lib.rs",
        "Instances",
        "../../providers/aws/src/instances.rs",
    ),
    (
        "Routes",
        "AwsCloud",
        "../../providers/aws/src/lib.rs",
        "RouteTables",
        "../../providers/aws/src/routes.rs",
    ),
];

/// The same hazard inside a provider: `AwsCloud` answers each trait by handing the call to a part
/// (`LoadBalancers`, `Instances`, `RouteTables`), and a method the part implements but the cloud does not
/// forward answers the trait's default. It happened: `AwsCloud` did not forward the retain methods, so the
/// manager refused `ccm.rs/load-balancer-retain` that the part honoured. Every method a part implements
/// must be implemented by its cloud.
#[test]
fn a_providers_cloud_forwards_every_method_its_parts_implement() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for (trait_name, outer, outer_file, inner, inner_file) in PROVIDER_FORWARDERS {
        let forwarded = decorator_impls(outer, outer_file)
            .remove(trait_name)
            .unwrap_or_else(|| panic!("no impl {trait_name} for {outer} in {outer_file}"));
        let implemented = decorator_impls(inner, inner_file)
            .remove(trait_name)
            .unwrap_or_else(|| panic!("no impl {trait_name} for {inner} in {inner_file}"));
        assert!(!implemented.is_empty(), "{inner}: no method found");
        for method in implemented.difference(&forwarded) {
            missing.push(format!(
                "{outer_file}: {outer} does not forward {trait_name}::{method}, which {inner} \
                 ({inner_file}) implements"
            ));
        }
        checked += implemented.len();
    }
    assert!(checked > 15, "only {checked} methods checked");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
