//! Routes of the fake cloud.

use async_trait::async_trait;
use cloud_provider::{CloudError, CloudResult, Route, Routes};

use crate::{FakeCloud, RouteRecord};

/// A route name unique per (name hint, CIDR), so dual-stack nodes get one route per family.
fn route_name(name_hint: &str, cidr: &str) -> String {
    let cidr: String = cidr
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{name_hint}-{cidr}")
}

#[async_trait]
impl Routes for FakeCloud {
    async fn list_routes(&self, _cluster: &str) -> CloudResult<Vec<Route>> {
        self.enter("list_routes").await?;
        self.refresh()?;
        let cloud = self.inner.lock();
        Ok(cloud
            .state
            .routes
            .iter()
            .map(|r| Route {
                name: r.name.clone(),
                target_node: r.target_node.clone(),
                destination_cidr: r.destination_cidr.clone(),
                blackhole: r.blackhole,
                ..Default::default()
            })
            .collect())
    }

    async fn create_route(
        &self,
        _cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        self.enter("create_route").await?;
        self.change(|cloud| {
            if let Some(existing) = cloud
                .state
                .routes
                .iter()
                .find(|r| r.destination_cidr == route.destination_cidr)
            {
                if existing.target_node == route.target_node && !existing.blackhole {
                    return Ok(());
                }
                return Err(CloudError::other(format!(
                    "fake cloud: a route for {} already exists ({}, target {:?})",
                    route.destination_cidr, existing.name, existing.target_node
                )));
            }
            cloud.state.routes.push(RouteRecord {
                name: route_name(name_hint, &route.destination_cidr),
                target_node: route.target_node.clone(),
                destination_cidr: route.destination_cidr.clone(),
                blackhole: false,
            });
            cloud.state.routes.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(())
        })
    }

    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        self.enter("delete_route").await?;
        self.change(|cloud| {
            cloud.state.routes.retain(|r| {
                let same = if route.name.is_empty() {
                    r.destination_cidr == route.destination_cidr
                        && r.target_node == route.target_node
                } else {
                    r.name == route.name
                };
                !same
            });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use cloud_provider::CloudProvider;

    use super::*;

    fn route(node: &str, cidr: &str) -> Route {
        Route {
            target_node: node.into(),
            destination_cidr: cidr.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn initial_routes_and_dual_stack_names() {
        let cloud = FakeCloud::from_yaml(
            "routes:\n  initial: [{name: stray, targetNode: node-x, destinationCIDR: 10.99.0.0/24, blackhole: true}]\n",
        )
        .unwrap();
        let routes = cloud.routes().unwrap();
        routes
            .create_route("k", "uid-1", &route("n1", "10.244.1.0/24"))
            .await
            .unwrap();
        routes
            .create_route("k", "uid-1", &route("n1", "fd00:10:244:1::/64"))
            .await
            .unwrap();
        // Creating the same route again is a no-op; the same CIDR to another node is refused.
        routes
            .create_route("k", "uid-1", &route("n1", "10.244.1.0/24"))
            .await
            .unwrap();
        assert!(
            routes
                .create_route("k", "uid-2", &route("n2", "10.244.1.0/24"))
                .await
                .is_err()
        );
        let listed = routes.list_routes("k").await.unwrap();
        let names: Vec<_> = listed.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["stray", "uid-1-10-244-1-0-24", "uid-1-fd00-10-244-1---64"]
        );
        assert!(listed[0].blackhole);
        routes.delete_route("k", &listed[0]).await.unwrap();
        routes
            .delete_route("k", &route("n1", "10.244.1.0/24"))
            .await
            .unwrap();
        let left: Vec<_> = routes
            .list_routes("k")
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.destination_cidr)
            .collect();
        assert_eq!(left, vec!["fd00:10:244:1::/64"]);
    }
}
