//! Pod-CIDR routes in the cluster's VPC route tables (`RouteTableID`, else every table tagged for the
//! cluster): destination the node's pod CIDR, target its instance. Routes whose instance is gone are
//! reported as blackholes.

use std::sync::Arc;

use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState, RouteTable};
use cloud_provider::{CloudResult, Route, Routes};

use crate::{
    Config, Error,
    error::Result,
    instances::{Describer, Key},
    sdk::Calls,
};

/// The route tables of one provider.
pub struct RouteTables {
    calls: Calls,
    describer: Arc<Describer>,
    config: Arc<Config>,
}

/// A route request's destination `cidr`: `(IPv4 CIDR block, IPv6 CIDR block)`, the one of its family
/// set.
fn destination(cidr: &str) -> (Option<String>, Option<String>) {
    if cidr.contains(':') {
        (None, Some(cidr.to_owned()))
    } else {
        (Some(cidr.to_owned()), None)
    }
}

impl RouteTables {
    /// Routes through `calls`.
    pub fn new(calls: Calls, describer: Arc<Describer>, config: Arc<Config>) -> Self {
        Self {
            calls,
            describer,
            config,
        }
    }

    /// The cluster's route tables.
    async fn tables(&self, cluster_name: &str) -> Result<Vec<RouteTable>> {
        let ec2 = &self.calls.clients.ec2;
        let filter = match &self.config.global.route_table_id {
            Some(id) => Filter::builder().name("route-table-id").values(id).build(),
            None => Filter::builder()
                .name("tag-key")
                .values(format!(
                    "kubernetes.io/cluster/{}",
                    self.config.cluster_id().unwrap_or(cluster_name)
                ))
                .build(),
        };
        let out = self
            .calls
            .call("DescribeRouteTables", || {
                ec2.describe_route_tables().filters(filter.clone()).send()
            })
            .await?;
        let tables = out.route_tables().to_vec();
        if tables.is_empty() {
            return Err(Error::Setup(format!(
                "unable to find route table for AWS cluster: {} (set RouteTableID, or tag a table kubernetes.io/cluster/<id>)",
                self.config.cluster_id().unwrap_or(cluster_name)
            )));
        }
        Ok(tables)
    }

    async fn list(&self, cluster_name: &str) -> Result<Vec<Route>> {
        let tables = self.tables(cluster_name).await?;
        // (destination, instance, AWS says blackhole), first table wins for a destination.
        let mut entries: Vec<(String, String, bool)> = Vec::new();
        for table in &tables {
            for r in table.routes() {
                let destination = r
                    .destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block())
                    .unwrap_or_default();
                // Gateways, endpoints, peering: not pod routes.
                let Some(instance_id) = r.instance_id() else {
                    continue;
                };
                if entries.iter().any(|(d, _, _)| d == destination) {
                    continue;
                }
                entries.push((
                    destination.to_owned(),
                    instance_id.to_owned(),
                    r.state() == Some(&RouteState::Blackhole),
                ));
            }
        }
        // The instances in one batched look-up.
        let instances = futures::future::try_join_all(entries.iter().map(|(_, id, _)| {
            let key = Key::Id(id.clone());
            async move { self.describer.find(&key).await }
        }))
        .await?;
        Ok(entries
            .into_iter()
            .zip(instances)
            .map(|((destination, instance_id, blackhole), instance)| {
                let (target_node, blackhole) = match instance {
                    Some(i) if !i.is_terminated() => (i.private_dns, blackhole),
                    // The instance is gone: AWS reports such routes as blackholes; so do we.
                    _ => (String::new(), true),
                };
                Route {
                    name: format!("{instance_id}-{destination}"),
                    target_node,
                    destination_cidr: destination,
                    blackhole,
                    ..Default::default()
                }
            })
            .collect())
    }

    async fn create(&self, cluster_name: &str, route: &Route) -> Result<()> {
        let ec2 = &self.calls.clients.ec2;
        let key = match crate::instances::instance_id_from_resource_name(&route.target_node) {
            Some(id) => Key::Id(id),
            None => Key::PrivateDns(route.target_node.clone()),
        };
        let instance = self
            .describer
            .find(&key)
            .await?
            .filter(|i| !i.is_terminated())
            .ok_or_else(|| Error::Setup(format!("no instance for node {}", route.target_node)))?;
        // Traffic to pod IPs is not the instance's own address: source/destination checks must be off.
        let attr = self
            .calls
            .call("DescribeInstanceAttribute", || {
                ec2.describe_instance_attribute()
                    .instance_id(&instance.id)
                    .attribute(aws_sdk_ec2::types::InstanceAttributeName::SourceDestCheck)
                    .send()
            })
            .await?;
        if attr
            .source_dest_check()
            .and_then(|a| a.value())
            .unwrap_or(true)
        {
            self.calls
                .call("ModifyInstanceAttribute", || {
                    ec2.modify_instance_attribute()
                        .instance_id(&instance.id)
                        .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                        .send()
                })
                .await?;
        }
        let cidr = &route.destination_cidr;
        let (v4, v6) = destination(cidr);
        for table in self.tables(cluster_name).await? {
            let table_id = table.route_table_id().unwrap_or_default();
            let existing = table.routes().iter().find(|r| {
                r.destination_cidr_block() == Some(cidr.as_str())
                    || r.destination_ipv6_cidr_block() == Some(cidr.as_str())
            });
            match existing {
                Some(r)
                    if r.instance_id() == Some(instance.id.as_str())
                        && r.state() != Some(&RouteState::Blackhole) => {}
                Some(_) => {
                    let request = ec2
                        .replace_route()
                        .route_table_id(table_id)
                        .instance_id(&instance.id)
                        .set_destination_cidr_block(v4.clone())
                        .set_destination_ipv6_cidr_block(v6.clone());
                    self.calls
                        .call("ReplaceRoute", || request.clone().send())
                        .await?;
                }
                None => {
                    let request = ec2
                        .create_route()
                        .route_table_id(table_id)
                        .instance_id(&instance.id)
                        .set_destination_cidr_block(v4.clone())
                        .set_destination_ipv6_cidr_block(v6.clone());
                    self.calls
                        .call("CreateRoute", || request.clone().send())
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn delete(&self, cluster_name: &str, route: &Route) -> Result<()> {
        let ec2 = &self.calls.clients.ec2;
        let cidr = &route.destination_cidr;
        for table in self.tables(cluster_name).await? {
            let present = table.routes().iter().any(|r| {
                r.destination_cidr_block() == Some(cidr.as_str())
                    || r.destination_ipv6_cidr_block() == Some(cidr.as_str())
            });
            if !present {
                continue;
            }
            let (v4, v6) = destination(cidr);
            let request = ec2
                .delete_route()
                .route_table_id(table.route_table_id().unwrap_or_default())
                .set_destination_cidr_block(v4)
                .set_destination_ipv6_cidr_block(v6);
            match self
                .calls
                .call("DeleteRoute", || request.clone().send())
                .await
            {
                Ok(_) => {}
                Err(e) if e.code() == Some("InvalidRoute.NotFound") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cloud_provider::async_trait]
impl Routes for RouteTables {
    #[tracing::instrument(skip_all)]
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        Ok(self.list(cluster_name).await?)
    }

    #[tracing::instrument(skip_all, fields(node = route.target_node, cidr = route.destination_cidr))]
    async fn create_route(
        &self,
        cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        Ok(self.create(cluster_name, route).await?)
    }

    #[tracing::instrument(skip_all, fields(cidr = route.destination_cidr))]
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        Ok(self.delete(cluster_name, route).await?)
    }
}
